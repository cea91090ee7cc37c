"""Starter cache: common openers ("Sure.", "好的", ...) synthesised at start-up.

A request whose text begins with a cached opener streams the cached audio at once while
the engine synthesises the rest. Pure data structure; filling it is the app's job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voxgate.bridge.pipeline import ChunkStream
from voxgate.text import is_cjk_char
from voxgate.types import AudioChunk, SynthesisRequest


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


class CachedOpener:
    """A `ChunkStream`: the cached opener's audio in `chunk_ms` pieces, then the engine on the
    rest of the segment (started once the first piece is out, so it does not delay it)."""

    def __init__(self, hit: StarterHit, chunk_ms: int, rest: Callable[[], ChunkStream] | None) -> None:
        step = max(1, hit.sample_rate * chunk_ms // 1000)
        now = time.perf_counter()
        self._pieces = [AudioChunk(np.ascontiguousarray(hit.samples[i : i + step]), hit.sample_rate, t_ready=now)
                        for i in range(0, len(hit.samples), step)]  # fmt: skip
        self._pieces.reverse()
        self._rest = rest
        self._stream: ChunkStream | None = None
        self._given = 0
        self._cancelled = False

    async def next(self) -> AudioChunk | None:
        if self._cancelled:
            return None
        if self._given and self._rest is not None and self._stream is None:
            self._stream = self._rest()
        if self._pieces:
            self._given += 1
            return self._pieces.pop()
        return await self._stream.next() if self._stream is not None else None

    def cancel(self, reason: str) -> None:
        self._cancelled = True
        if self._stream is not None:
            self._stream.cancel(reason)


def opener_stream(
    cache: StarterCache, request: SynthesisRequest, chunk_ms: int, engine_stream: Callable[[str], ChunkStream]
) -> CachedOpener | None:
    """The cached opener `request.text` begins with, then `engine_stream(rest)` on what follows
    it; None when no opener matches or the request asks for what the cache was not made with
    (another speed, a seed, instructions). Every transport that speaks a starter segment (the
    bridge, the WebSocket gateway) goes through here."""
    if request.speed != 1.0 or request.seed is not None or request.instructions:
        return None
    hit = cache.match(request.voice, request.text)
    if hit is None:
        return None
    rest = None
    if any(ch.isalnum() for ch in hit.remainder):  # "好的，" leaves only the comma

        def rest() -> ChunkStream:
            return engine_stream(hit.remainder)

    return CachedOpener(hit, chunk_ms, rest)
