"""Good recordings for the regression harness's tests: the tone engine's speech stand-in and
a seeded synthetic voice (voiced syllables with gliding pitch, fricative noise, pauses)."""

from __future__ import annotations

import numpy as np

from voxgate.engines.base import collect
from voxgate.engines.tone import ToneEngine
from voxgate.types import SynthesisRequest

TEXT = "The weather tomorrow will be sunny in the morning, with light clouds drifting in from the west."


def tone_speech() -> tuple[np.ndarray, int]:
    engine = ToneEngine()
    return collect(engine, SynthesisRequest(text=TEXT, voice="tone")).samples, engine.sample_rate


def synthetic_speech(seconds: float = 4.0, sample_rate: int = 22050, seed: int = 3) -> tuple[np.ndarray, int]:
    """Syllables of 120-260 ms: a harmonic voice (f0 gliding between 90 and 220 Hz, 12
    harmonics) under a smooth envelope, every third one a fricative (high-passed noise),
    with 40-160 ms pauses between them; peak 0.6."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    while sum(len(p) for p in parts) < seconds * sample_rate:
        n = int(rng.uniform(0.12, 0.26) * sample_rate)
        env = np.hanning(n)
        if len(parts) % 6 == 4:
            noise = np.diff(rng.standard_normal(n + 1))
            parts.append(0.15 * noise * env)
        else:
            f0 = np.linspace(rng.uniform(90, 220), rng.uniform(90, 220), n)
            phase = 2 * np.pi * np.cumsum(f0) / sample_rate
            voice = sum(np.sin(k * phase) / k for k in range(1, 13))
            parts.append(voice * env * rng.uniform(0.4, 1.0))
        parts.append(np.zeros(int(rng.uniform(0.04, 0.16) * sample_rate)))
    x = np.concatenate(parts)
    return (0.6 * x / np.abs(x).max()).astype(np.float32), sample_rate


GOOD = {"tone": tone_speech, "synthetic": synthetic_speech}
