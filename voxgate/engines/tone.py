"""`tone`: deterministic synthetic speech stand-in for protocol and load tests.

Each text unit becomes a short tone whose pitch is a hash of the unit, so audio length and
content follow the text exactly: `unit_ms / speed` per unit, identical on every run.
No model, negligible compute (optionally a simulated per-chunk delay).

Fault injection for protocol tests: the unit `[[fail]]` makes the engine raise
`EngineFailure` when it reaches it, so clients and servers can be tested on a stream that
breaks part-way.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from functools import lru_cache

import numpy as np

from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.text import split_units
from voxgate.types import AudioChunk, CancelToken, EngineFailure, SynthesisRequest, VoiceInfo

SAMPLE_RATE = 24000
FAIL_UNIT = "[[fail]]"
_FADE_S = 0.005
_VOICES = {"tone": 1.0, "tone-high": 2.0}  # voice -> pitch multiplier


def unit_samples(unit_ms: float, speed: float, sample_rate: int = SAMPLE_RATE) -> int:
    """Samples one unit lasts at this speed."""
    return max(1, round(unit_ms / speed * sample_rate / 1000))


@lru_cache(maxsize=4096)
def unit_tone(unit_text: str, n: int, pitch: float, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """The tone for one unit: frequency from a CRC of the text, faded at both ends. Cached
    (read-only): the engine stands in for an instant one, so what a load test measures is the
    server around it (a tone costs ~90 us to compute, ~1 us from the cache)."""
    freq = (200.0 + zlib.crc32(unit_text.encode()) % 600) * pitch
    t = np.arange(n, dtype=np.float64) / sample_rate
    wave = 0.3 * np.sin(2 * np.pi * freq * t)
    fade = min(n // 2, int(_FADE_S * sample_rate))
    if fade:
        ramp = np.linspace(0.0, 1.0, fade)
        wave[:fade] *= ramp
        wave[n - fade :] *= ramp[::-1]
    tone = wave.astype(np.float32)
    tone.flags.writeable = False
    return tone


class ToneEngine(Engine):
    name = "tone"
    sample_rate = SAMPLE_RATE

    def __init__(self, unit_ms: float = 120, delay_ms: float = 0.0, units_per_chunk: int = 1) -> None:
        self.unit_ms = unit_ms
        self.delay_s = delay_ms / 1000
        self.units_per_chunk = units_per_chunk
        # the tones are computed under the GIL: one thread is as fast as many, and keeps the
        # event loop's share; a simulated delay waits instead, so then one thread per stream
        self.parallel_calls = None if delay_ms else 1

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(v, self.name, ("*",), f"synthetic tones, pitch x{p:g}") for v, p in _VOICES.items()]

    def warmup(self) -> None:
        return None

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        pitch = _VOICES.get(request.voice, 1.0)
        n = unit_samples(self.unit_ms, request.speed)
        units = split_units(request.text)
        for seq, first in enumerate(range(0, len(units), self.units_per_chunk)):
            if cancel.cancelled or (self.delay_s and cancel.wait(self.delay_s)):
                return
            group = units[first : first + self.units_per_chunk]
            if any(u.text == FAIL_UNIT for u in group):
                raise EngineFailure(f"injected failure at unit {group[0].index}")
            samples = np.concatenate([unit_tone(u.text, n, pitch) for u in group])
            yield AudioChunk(samples, SAMPLE_RATE, seq, group[0].index, group[-1].index + 1, time.perf_counter())

    def close(self) -> None:
        return None


def create(settings: Settings) -> ToneEngine:
    return ToneEngine(settings.tone_unit_ms, settings.tone_delay_ms, settings.tone_units_per_chunk)
