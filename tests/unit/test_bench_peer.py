"""voxgate.bench.peer against a stand-in for faster-qwen3-tts (the real one needs CUDA and is not installed
here): the calls it makes, what it measures, and the errors it gives."""

from __future__ import annotations

import importlib.machinery
import sys
import time
import types
from typing import ClassVar

import numpy as np
import pytest

from voxgate.bench import peer

SAMPLES_PER_FRAME = 1920


class FakePeer:
    """Streams `chunk_size` frames of silence per chunk (2 ms each), stopping after `stop_after` frames when set."""

    calls: ClassVar[list[dict]] = []
    stop_after: ClassVar[int | None] = None

    def __init__(self, kind: str) -> None:
        self.sample_rate = 24000
        self.model = types.SimpleNamespace(
            model=types.SimpleNamespace(tts_model_type=kind), get_supported_speakers=lambda: ["aiden", "ryan"]
        )

    @classmethod
    def from_pretrained(cls, model_dir, device="cuda", dtype=None, max_seq_len=2048):
        return cls("custom_voice" if "cv" in model_dir else "base")

    def generate_custom_voice_streaming(self, text, speaker, language, max_new_tokens, min_new_tokens, chunk_size):
        FakePeer.calls.append({"speaker": speaker, "min": min_new_tokens, "max": max_new_tokens, "chunk": chunk_size})
        total = min(max_new_tokens, self.stop_after or max_new_tokens)
        done = 0
        while done < total:
            n = min(chunk_size, total - done)
            done += n
            time.sleep(0.002)
            timing = {"chunk_steps": n, "decode_ms": 2.0 * n, "prefill_ms": 5.0 if done == n else 0.0}
            yield np.zeros(n * SAMPLES_PER_FRAME, dtype=np.float32), self.sample_rate, timing


@pytest.fixture
def fake_peer(monkeypatch):
    pytest.importorskip("torch")
    for name in ("faster_qwen3_tts", "qwen_tts", "librosa", "soundfile"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers looks for some of them
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["faster_qwen3_tts"].FasterQwen3TTS = FakePeer
    sys.modules["faster_qwen3_tts"].__version__ = "0.5.4"
    monkeypatch.setattr(peer, "_stub_unused_imports", lambda: None)
    monkeypatch.setattr(FakePeer, "calls", [])
    monkeypatch.setattr(FakePeer, "stop_after", None)
    return FakePeer


def test_times_each_packet_size_with_eos_blocked(fake_peer):
    result = peer.run_faster_qwen3_tts("/x/cv06", "Hello.", None, "english", 5, [1, 4], 3, "cpu", "float32")
    assert result["peer"] == "faster-qwen3-tts" and result["version"] == "0.5.4"
    assert result["speaker"] == "aiden" and "note" not in result
    assert [c["chunk"] for c in fake_peer.calls] == [1] * 4 + [4] * 4  # a warm-up and 3 timed runs each
    assert all(c["min"] == c["max"] == 5 and c["speaker"] == "aiden" for c in fake_peer.calls)
    for packet in ("1", "4"):
        row = result["packets"][packet]
        assert row["frames"] == 5 and row["runs"] == 3 and row["audio_s"] == pytest.approx(0.4)
        assert 0 < row["ttfa_ms_p50"] <= row["ttfa_ms_p95"]
        assert row["rtf"] > 0 and row["ms_per_frame"] > 0
        assert row["codes_ms_per_frame"] == pytest.approx(2.0) and row["prefill_ms"] == pytest.approx(5.0)


def test_notes_a_frame_count_that_is_not_the_one_asked_for(fake_peer):
    fake_peer.stop_after = 3
    result = peer.run_faster_qwen3_tts("/x/cv06", "Hello.", "ryan", "english", 5, [2], 1, "cpu", "float32")
    assert result["packets"]["2"]["frames"] == 3
    assert "produced [3]" in result["note"]


def test_refuses_a_voice_clone_checkpoint(fake_peer):
    with pytest.raises(ValueError, match="reference audio"):
        peer.run_faster_qwen3_tts("/x/b06", "Hello.", None, "english", 5, [1], 1, "cpu", "float32")


@pytest.mark.parametrize(("missing", "wheel"), [("faster_qwen3_tts", "faster-qwen3-tts==0.5.4"),
                                                ("qwen_tts", "qwen-tts-hf==0.1.1.post1")])  # fmt: skip
def test_a_missing_package_names_its_wheel(fake_peer, monkeypatch, missing, wheel):
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(RuntimeError, match=wheel.replace(".", r"\.")):
        peer.run_faster_qwen3_tts("/x/cv06", "Hello.", None, "english", 5, [1], 1, "cpu", "float32")


def test_ttfa_waits_for_the_first_non_empty_chunk():
    chunks = [(np.zeros(0), 24000, {"chunk_steps": 1}), (np.zeros(3840), 24000, {"chunk_steps": 2})]
    run = peer.time_stream(iter(chunks), start=0.0)
    assert run.ttfa_s is not None and run.first_chunk_frames == 3 and run.frames == 3 and run.samples == 3840
