"""Faults injected on purpose: each turns a good recording into one a gate must fail.

Pure functions (numpy in, numpy out) shared by the harness's own tests and by
`voxgate regress tts --inject FAULT`, which applies one to the engine's streamed audio so a
whole run can be shown to FAIL with the right gate. `EXPECTED_GATE` says which.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from voxgate.regress.signals import speech_frames


def _middle(x: np.ndarray, sample_rate: int) -> int:
    """A sample index in the middle of the speech (not in leading or trailing silence)."""
    voiced = np.flatnonzero(speech_frames(x, sample_rate))
    if voiced.size == 0:
        return len(x) // 2
    frame = round(0.01 * sample_rate)
    return int((voiced[0] + voiced[-1]) // 2 * frame)


def _speechiest_window(x: np.ndarray, sample_rate: int, seconds: float) -> int:
    """Start of the `seconds` window holding the most speech frames (first such window)."""
    frames = speech_frames(x, sample_rate).astype(np.int64)
    width = max(1, round(seconds / 0.01))
    if len(frames) <= width:
        return 0
    counts = np.convolve(frames, np.ones(width, dtype=np.int64), mode="valid")
    return int(np.argmax(counts)) * round(0.01 * sample_rate)


def insert_silence(x: np.ndarray, sample_rate: int, seconds: float = 1.5) -> np.ndarray:
    """Digital silence spliced into the middle of the speech."""
    at = _middle(x, sample_rate)
    return np.concatenate([x[:at], np.zeros(round(seconds * sample_rate), dtype=x.dtype), x[at:]])


def clip(x: np.ndarray, sample_rate: int, gain: float = 4.0) -> np.ndarray:
    """Too much gain, then hard clipping at full scale."""
    return np.clip(x * gain, -1.0, 1.0).astype(x.dtype)


def repeat_segment(x: np.ndarray, sample_rate: int, seconds: float = 0.6) -> np.ndarray:
    """The `seconds` of audio holding the most speech said twice in a row (a decoder loop)."""
    start = _speechiest_window(x, sample_rate, seconds)
    end = min(len(x), start + round(seconds * sample_rate))
    return np.concatenate([x[:end], x[start:end], x[end:]])


def speed_up(x: np.ndarray, sample_rate: int, factor: float = 1.1) -> np.ndarray:
    """Played `factor` times faster (linear interpolation): shorter and higher."""
    n = max(1, round(len(x) / factor))
    return np.interp(np.linspace(0, len(x) - 1, n), np.arange(len(x)), x).astype(x.dtype)


def spike(x: np.ndarray, sample_rate: int, amplitude: float = 0.95) -> np.ndarray:
    """A one-sample pop in the middle of the speech."""
    y = x.copy()
    at = _middle(x, sample_rate)
    y[at] = amplitude if y[at] < 0 else -amplitude
    return y


def nan(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """A NaN sample (a numerical blow-up)."""
    y = x.copy()
    if y.size:
        y[len(y) // 2] = np.nan
    return y


def empty(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """No audio at all."""
    return x[:0]


def noise(x: np.ndarray, sample_rate: int, seed: int | None = None) -> np.ndarray:
    """Quiet noise that differs on every call (seed None): the output is no longer
    deterministic and drifts from the golden baseline."""
    rng = np.random.default_rng(seed)
    return (x + 0.01 * rng.standard_normal(len(x))).astype(x.dtype)


FAULTS: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "silence": insert_silence,
    "clip": clip,
    "repeat": repeat_segment,
    "speed": speed_up,
    "spike": spike,
    "nan": nan,
    "empty": empty,
    "noise": noise,
}

EXPECTED_GATE: dict[str, str] = {
    "silence": "max_silence_gap",
    "clip": "clipping",
    "repeat": "repeat",
    "speed": "duration_vs_golden",
    "spike": "pop_click",
    "nan": "audio_valid",
    "empty": "audio_valid",
    "noise": "determinism",
}
