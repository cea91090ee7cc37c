"""A peer system timed side by side with ours: faster-qwen3-tts (PyPI, 0.5.4), Qwen3-TTS with CUDA graphs.

The peer is no dependency of voxgate: on the GPU machine (no network) its wheels are installed from
`.gpu/peer/whl` (see `.gpu/peer/README.txt`); every import of it happens inside `run_faster_qwen3_tts`,
and a missing package raises a RuntimeError that names the wheel to carry.

What is timed mirrors `voxgate bench tts`: the checkpoint is loaded once, each packet size gets one
untimed warm-up generation (the first one also captures the peer's CUDA graphs, at the real prompt
length), then `runs` timed streaming generations of exactly `frames` frames: the peer's decode loop
suppresses EOS while fewer than `min_new_tokens` frames exist and stops at `max_new_tokens`, so both set
to `frames` fix the length, as our bench does for random weights. Per packet size (the peer's
`chunk_size`, in 80 ms frames):

- ttfa_ms_p50 / ttfa_ms_p95: from the call to the first non-empty PCM chunk on the host (the peer
  yields numpy arrays);
- rtf: wall time of the whole stream / seconds of audio it yielded (median over runs);
- ms_per_frame: wall time after the first chunk / frames after it (steady-state cost of a frame:
  talker, code predictor and codec decode; the whole wall time / frames where one chunk holds all);
- codes_ms_per_frame, prefill_ms: the peer's own timings of its decode loop (codec decode excluded)
  and of its prompt prefill;
- frames: frames produced (equal to `frames`, else a "note" says so).

On the GPU machine: `python -m voxgate.bench.peer --model-dir DIR --device cuda --dtype bfloat16`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxgate.bench.import_stubs import stub_missing
from voxgate.bench.stats import percentile

PEER = "faster-qwen3-tts"
PEER_VERSION = "0.5.4"
SAMPLE_RATE = 24000
FRAME_S = 0.08
VOICE_DESIGN_INSTRUCT = "A calm voice."

# Module -> the wheel (in .gpu/peer/whl) that provides it, for the peer's import and run-time needs
# that the GPU image lacks.
WHEELS = {
    "faster_qwen3_tts": "faster-qwen3-tts==0.5.4",
    "qwen_tts": "qwen-tts-hf==0.1.1.post1",
    "transformers": "transformers==5.15.1",
    "tokenizers": "tokenizers==0.22.2",
    "accelerate": "accelerate==1.12.0",
    "librosa": "librosa==0.11.0",
    "soundfile": "soundfile==0.14.0",
    "_soundfile": "soundfile==0.14.0",
    "_cffi_backend": "cffi==2.1.1",
    "cffi": "cffi==2.1.1",
    "pycparser": "pycparser==3.12",
    "soxr": "soxr==1.1.0",
    "audioread": "audioread==3.1.0",
    "decorator": "decorator==5.3.1",
    "pooch": "pooch==1.9.0",
    "platformdirs": "platformdirs==4.14.8",
    "sox": "sox==1.4.1",
}

# Imported by qwen_tts for its 25 Hz tokenizer only, which the 12 Hz models never run.
_UNUSED_BY_12HZ = ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")


def _stub_unused_imports() -> None:
    """Stand empty modules in for the 25 Hz tokenizer's imports where they do not import here."""
    stub_missing(_UNUSED_BY_12HZ)


def _import_peer() -> tuple[Any, str]:
    """The peer's model class and version; a RuntimeError naming the wheel when a package is missing."""
    try:
        import faster_qwen3_tts

        _stub_unused_imports()
        importlib.import_module("qwen_tts")  # the peer imports it lazily, at load: fail here instead
        importlib.import_module("librosa")
        importlib.import_module("soundfile")
    except ImportError as e:
        missing = (getattr(e, "name", None) or "").split(".")[0]
        wheel = WHEELS.get(missing, f"the wheel that provides {missing or 'it'}")
        raise RuntimeError(
            f"{PEER} cannot be imported ({e}); carry and install {wheel}: "
            "python3 -m pip install --no-index --no-deps --target /tmp/site .gpu/peer/whl/*.whl "
            "and PYTHONPATH=/tmp/site (see .gpu/peer/README.txt)"
        ) from e
    return faster_qwen3_tts.FasterQwen3TTS, getattr(faster_qwen3_tts, "__version__", "unknown")


def _version(dist: str) -> str | None:
    """An installed distribution's version (the first on sys.path, as imports see it)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class StreamRun:
    """One timed streaming generation."""

    ttfa_s: float | None  # call start -> first non-empty PCM chunk on the host
    wall_s: float
    samples: int
    frames: int
    first_chunk_frames: int
    codes_s: float  # the peer's decode-loop time (talker + predictor), codec decode excluded
    prefill_s: float


def time_stream(chunks: Iterable[tuple[Any, int, dict[str, Any]]], start: float) -> StreamRun:
    """Drain the peer's `(pcm, sample_rate, timing)` stream, timing it from `start` (perf_counter)."""
    ttfa = None
    samples = frames = first = 0
    codes = prefill = 0.0
    for pcm, _sr, timing in chunks:
        n = len(pcm)
        if ttfa is None and n:
            ttfa = time.perf_counter() - start
            first = frames + int(timing.get("chunk_steps", 0))
        samples += n
        frames += int(timing.get("chunk_steps", 0))
        codes += float(timing.get("decode_ms", 0.0)) / 1000
        prefill += float(timing.get("prefill_ms", 0.0)) / 1000
    wall = time.perf_counter() - start
    return StreamRun(ttfa, wall, samples, frames, first, codes, prefill)


def summarise(runs: Sequence[StreamRun], sample_rate: int = SAMPLE_RATE) -> dict[str, Any]:
    """Per-packet figures over the timed runs (see the module docstring)."""

    def r(x: float | None, digits: int) -> float | None:
        return None if x is None else round(x, digits)

    ttfa_ms = [1000 * run.ttfa_s for run in runs if run.ttfa_s is not None]
    rtf = [run.wall_s / (run.samples / sample_rate) for run in runs if run.samples]
    per_frame = []
    for run in runs:
        if run.ttfa_s is not None and run.frames > run.first_chunk_frames:
            per_frame.append(1000 * (run.wall_s - run.ttfa_s) / (run.frames - run.first_chunk_frames))
        elif run.frames:
            per_frame.append(1000 * run.wall_s / run.frames)
    frames = sorted({run.frames for run in runs})
    return {
        "ttfa_ms_p50": r(percentile(ttfa_ms, 50), 1),
        "ttfa_ms_p95": r(percentile(ttfa_ms, 95), 1),
        "rtf": r(statistics.median(rtf), 4) if rtf else None,
        "ms_per_frame": r(statistics.median(per_frame), 2) if per_frame else None,
        "codes_ms_per_frame": r(statistics.median(1000 * x.codes_s / x.frames for x in runs if x.frames), 2)
        if any(x.frames for x in runs)
        else None,
        "prefill_ms": r(statistics.median(1000 * x.prefill_s for x in runs), 1) if runs else None,
        "audio_s": r(statistics.median(x.samples / sample_rate for x in runs), 3) if runs else None,
        "frames": frames[0] if len(frames) == 1 else frames,
        "runs": len(runs),
    }


def run_faster_qwen3_tts(
    model_dir: str,
    text: str,
    speaker: str | None,
    language: str,
    frames: int,
    packet_frames: list[int],
    runs: int,
    device: str,
    dtype: str,
) -> dict:
    """Load faster-qwen3-tts once from a local checkpoint (official layout), warm it up, then time `runs`
    streaming generations of exactly `frames` frames for each packet size in `packet_frames`.

    `speaker` None takes the checkpoint's first speaker (CustomVoice); a VoiceDesign checkpoint gets a
    fixed instruction; a Base (voice-clone) checkpoint is refused (it needs reference audio). The peer's
    torch backend needs CUDA (`device` "cuda" or "cuda:N"); `dtype` is a torch dtype name.
    """
    if frames < 1 or runs < 1 or not packet_frames or min(packet_frames) < 1:
        raise ValueError("frames, runs and every packet size must be >= 1")
    model_cls, version = _import_peer()
    import torch

    def sync() -> None:
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    try:
        model = model_cls.from_pretrained(
            model_dir, device=device, dtype=getattr(torch, dtype), max_seq_len=max(2048, frames + 512)
        )
    except AttributeError as e:  # qwen-tts-hf 0.1.1.post1 under transformers 5.17: MimiConfig has no rope_theta
        if "rope_theta" not in str(e):
            raise
        raise RuntimeError(
            f"qwen-tts-hf cannot load under transformers {_version('transformers')} ({e}); "
            "install transformers==5.15.1 and tokenizers==0.22.2 from .gpu/peer/whl (see .gpu/peer/README.txt)"
        ) from e
    sync()
    load_s = time.perf_counter() - t0

    official = model.model  # the qwen_tts.Qwen3TTSModel the peer wraps
    kind = official.model.tts_model_type
    common = {"text": text, "language": language}
    generate: Callable[..., Iterator[tuple[Any, int, dict[str, Any]]]]
    if kind == "custom_voice":
        speaker = speaker or (official.get_supported_speakers() or [None])[0]
        generate, common["speaker"] = model.generate_custom_voice_streaming, speaker
    elif kind == "voice_design":
        generate, common["instruct"], speaker = model.generate_voice_design_streaming, VOICE_DESIGN_INSTRUCT, None
    else:
        raise ValueError(f"{PEER}: a {kind!r} checkpoint needs reference audio; use CustomVoice or VoiceDesign")

    def once(packet: int, seed: int) -> StreamRun:
        torch.manual_seed(seed)
        sync()
        start = time.perf_counter()
        stream = generate(**common, max_new_tokens=frames, min_new_tokens=frames, chunk_size=packet)
        return time_stream(stream, start)

    packets: dict[str, Any] = {}
    produced: set[int] = set()
    warmup_s = 0.0
    for packet in packet_frames:
        t1 = time.perf_counter()
        once(packet, seed=0)  # warm-up (graph capture on the first)
        warmup_s += time.perf_counter() - t1
        timed = [once(packet, seed=1 + i) for i in range(runs)]
        produced.update(x.frames for x in timed)
        packets[str(packet)] = summarise(timed, getattr(model, "sample_rate", SAMPLE_RATE))

    result: dict[str, Any] = {
        "peer": PEER,
        "version": version,
        "transformers": _version("transformers"),
        "model": Path(model_dir).name,
        "model_type": kind,
        "speaker": speaker,
        "language": language,
        "device": str(device),
        "gpu": torch.cuda.get_device_name() if str(device).startswith("cuda") else None,
        "dtype": dtype,
        "frames": frames,
        "load_s": round(load_s, 2),
        "warmup_s": round(warmup_s, 2),
        "packets": packets,
    }
    if str(device).startswith("cuda"):
        result["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if produced != {frames}:
        result["note"] = f"asked for {frames} frames (EOS blocked); the peer produced {sorted(produced)}"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m voxgate.bench.peer", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="Qwen3-TTS checkpoint directory (official layout)")
    parser.add_argument("--text", default="The quick brown fox jumps over the lazy dog, and then it runs far away.")
    parser.add_argument("--speaker", default=None, help="CustomVoice speaker (default: the first)")
    parser.add_argument("--language", default="english")
    parser.add_argument("--frames", type=int, default=40, help="frames per utterance (80 ms each; default 40)")
    parser.add_argument("--packet-frames", default="1,4", help="packet sizes to time (default 1,4)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    result = run_faster_qwen3_tts(
        args.model_dir,
        args.text,
        args.speaker,
        args.language,
        args.frames,
        [int(p) for p in args.packet_frames.split(",")],
        args.runs,
        args.device,
        args.dtype,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
