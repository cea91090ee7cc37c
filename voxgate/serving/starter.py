"""Starter cache: common openers ("Sure.", "好的", ...) synthesised at start-up.

A request whose text begins with a cached opener streams the cached audio at once while
the engine synthesises the rest. Pure data structure; filling it is the app's job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voxgate.text import is_cjk_char


@dataclass(frozen=True, slots=True)
class StarterHit:
    phrase: str
    samples: np.ndarray
    sample_rate: int
    remainder: str  # the text still to synthesise, possibly empty


class StarterCache:
    """Cached opener audio by (voice, phrase); filled at start-up, then read-only."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[np.ndarray, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, voice: str, phrase: str, samples: np.ndarray, sample_rate: int) -> None:
        key = phrase.strip()
        if key and len(samples):
            self._entries[(voice, key)] = (samples, sample_rate)

    def phrases(self, voice: str) -> list[str]:
        return [p for v, p in self._entries if v == voice]

    def match(self, voice: str, text: str) -> StarterHit | None:
        """The longest cached opener that `text` begins with, on a word boundary."""
        body = text.lstrip()
        candidates = [
            phrase
            for v, phrase in self._entries
            if v == voice and body.startswith(phrase) and _boundary(phrase, body[len(phrase) :])
        ]
        if not candidates:
            return None
        best = max(candidates, key=len)
        samples, rate = self._entries[(voice, best)]
        return StarterHit(best, samples, rate, body[len(best) :].strip())


def _boundary(phrase: str, rest: str) -> bool:
    """'Sure' must not match 'Surely'; CJK openers may be followed by anything."""
    if not rest or is_cjk_char(phrase[-1]) or not phrase[-1].isalnum():
        return True
    return not rest[0].isalnum()
