"""The fixed text set of `voxgate regress tts` (texts.toml in this package)."""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Literal

Mode = Literal["fast", "full"]


@dataclass(frozen=True, slots=True)
class TextCase:
    id: str
    language: str
    text: str
    fast: bool = False


def load_texts(mode: Mode) -> list[TextCase]:
    """The texts a mode runs: the `fast = true` subset, or all of them."""
    raw = tomllib.loads((resources.files("voxgate.regress") / "texts.toml").read_text(encoding="utf-8"))
    cases = [TextCase(t["id"], t["language"], t["text"], bool(t.get("fast", False))) for t in raw["text"]]
    return [c for c in cases if mode == "full" or c.fast]


def texts_digest(cases: list[TextCase]) -> str:
    """A short hash of the ids and texts, so a baseline knows which texts it was made from."""
    h = hashlib.sha256()
    for case in cases:
        h.update(f"{case.id}\0{case.language}\0{case.text}\n".encode())
    return h.hexdigest()[:16]
