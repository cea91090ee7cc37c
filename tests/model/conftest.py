"""Tiny random-weight Qwen3-TTS checkpoints (built once per session) and the official
implementation as a parity reference."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from voxgate.engines.qwen3.checkpoint import make_random_checkpoint  # noqa: E402
from voxgate.engines.qwen3.loader import Qwen3Checkpoint, load_checkpoint  # noqa: E402

MODELS = {
    "cv06": "Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "cv17": "Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "vd17": "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
    "b06": "Qwen3-TTS-12Hz-0.6B-Base",
}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen3")
    return {key: make_random_checkpoint(name, root / key, tiny=True, seed=7) for key, name in MODELS.items()}


@pytest.fixture(scope="session")
def ours(tiny_dirs: dict[str, Path]) -> dict[str, Qwen3Checkpoint]:
    return {key: load_checkpoint(path) for key, path in tiny_dirs.items()}


def _stub_unused_imports() -> None:
    """`import qwen_tts` imports sox and torchaudio for its 25 Hz tokenizer, which the 12 Hz
    models never use; neither installs beside torch 2.13 here, so empty modules stand in."""
    for name in ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        try:
            importlib.import_module(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = stub


@pytest.fixture(scope="session")
def official(tiny_dirs: dict[str, Path]):
    """The official package's model per tiny checkpoint (fp32, eager attention, CPU)."""
    _stub_unused_imports()
    qwen_tts = pytest.importorskip("qwen_tts")
    return {
        key: qwen_tts.Qwen3TTSModel.from_pretrained(
            str(path), dtype=torch.float32, attn_implementation="eager", device_map="cpu"
        )
        for key, path in tiny_dirs.items()
    }
