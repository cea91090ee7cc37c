"""Stand-in modules for what a reference package imports but the path we run never calls.

The official Qwen3-TTS package (and the peers built on it) import, at module level, packages
used only by its 25 Hz tokenizer, its demo or audio-file input (sox, torchaudio, librosa,
soundfile, onnxruntime). The GPU machine's bundles leave them out; a stand-in lets the import
succeed, and anything taken from it raises when called, so a path that did need one fails
loudly instead of running on a stand-in. Standard library only: the peers' own processes
(`peer_batch_child.py`) import it beside their own stack.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from collections.abc import Iterable
from typing import Any

# Imported by `import qwen_tts` (and faster-qwen3-tts) but never called by the 12 Hz models.
UNUSED_BY_12HZ = ("sox", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "librosa",
                  "librosa.filters", "soundfile", "onnxruntime")  # fmt: skip


def stub_missing(names: Iterable[str] = UNUSED_BY_12HZ) -> list[str]:
    """Import each module in `names`; put a stand-in in `sys.modules` for each that does not
    import here (missing, or a native library that fails to load). Returns those stubbed."""
    stubbed = []
    for name in names:
        try:
            importlib.import_module(name)
        except (ImportError, OSError):
            _stub(name)
            stubbed.append(name)
    return stubbed


def _stub(name: str) -> None:
    def missing(*_: Any, **__: Any) -> Any:
        raise RuntimeError(f"{name} is not installed; the 12 Hz path should not need it")

    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def attribute(attr: str) -> Any:  # PEP 562: any name imported from it is the stand-in
        if attr.startswith("__"):
            raise AttributeError(attr)  # the import system's own probes (__path__, ...)
        return missing

    module.__getattr__ = attribute  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, module)
