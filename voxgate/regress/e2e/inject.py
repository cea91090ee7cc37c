"""What a case does to the user's speech before the bot says it: background noise at a set
SNR and the P1 anomalies (a boom, a speed drift, distortion; the last two are the tts
harness's `faults`). Pure numpy, seeded, no I/O; mono float32 in [-1, 1] in and out.
"""

from __future__ import annotations

import numpy as np

from voxgate.regress import faults, signals


def pink_noise(n: int, seed: int = 0) -> np.ndarray:
    """`n` samples of 1/f noise (white noise shaped in the frequency domain), unit RMS."""
    if n <= 0:
        return np.zeros(0, dtype=np.float32)
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1.0))
    noise = np.fft.irfft(spectrum, n)
    return (noise / max(signals.rms(noise), 1e-12)).astype(np.float32)


def white_noise(n: int, seed: int = 0) -> np.ndarray:
    """`n` samples of Gaussian white noise, unit RMS."""
    return np.random.default_rng(seed).standard_normal(max(n, 0)).astype(np.float32)


NOISES = {"pink": pink_noise, "white": white_noise}


def mix_at_snr(speech: np.ndarray, sample_rate: int, snr_db: float, kind: str = "pink", seed: int = 0) -> np.ndarray:
    """`speech` plus noise scaled so that speech RMS (over its speech frames) over noise RMS
    is `snr_db`; the noise runs under the whole clip (leading and trailing silence too),
    and the sum is scaled down if it would clip."""
    if kind not in NOISES:
        raise ValueError(f"unknown noise {kind!r}; known: {', '.join(NOISES)}")
    x = np.asarray(speech, dtype=np.float32)
    voiced = signals.speech_frames(x, sample_rate)
    n = round(signals.FRAME_S * sample_rate)
    level = signals.rms(x[: len(voiced) * n].reshape(-1, n)[voiced]) if voiced.any() else signals.rms(x)
    noise = NOISES[kind](len(x), seed) * level / 10 ** (snr_db / 20)
    mixed = x + noise
    peak = float(np.max(np.abs(mixed))) if mixed.size else 0.0
    return (mixed / peak * 0.98 if peak > 0.98 else mixed).astype(np.float32)


def add_boom(x: np.ndarray, sample_rate: int, at_s: float, peak: float = 0.95, length_s: float = 0.03) -> np.ndarray:
    """A boom (a mic bumped): a `length_s` 120 Hz burst of `peak`, decaying, added at `at_s`."""
    y = np.array(x, dtype=np.float32)
    start = min(max(0, round(at_s * sample_rate)), max(0, len(y) - 1))
    t = np.arange(min(round(length_s * sample_rate), len(y) - start)) / sample_rate
    y[start : start + len(t)] += peak * np.sin(2 * np.pi * 120 * t) * np.exp(-t / (length_s / 3))
    return np.clip(y, -1.0, 1.0)


ANOMALIES = ("spike", "speed", "distort")


def apply(x: np.ndarray, sample_rate: int, kind: str, params: dict[str, float]) -> np.ndarray:
    """One anomaly by name, as a case file names it: `spike` (a boom, `add_boom`), `speed`
    (`faults.speed_up`: a drifting clock), `distort` (`faults.clip`: overdriven, clipped)."""
    y = np.asarray(x, dtype=np.float32)
    if kind == "spike":
        return add_boom(y, sample_rate, **params)
    if kind == "speed":
        return faults.speed_up(y, sample_rate, **params)
    if kind == "distort":
        return faults.clip(y, sample_rate, **params)
    raise ValueError(f"unknown anomaly {kind!r}; known: {', '.join(ANOMALIES)}")


# ---------------------------------------------------------------------------- heard-audio faults
# `voxgate regress e2e --inject NAME` corrupts every reply as heard, before it is measured, so a
# run shows it FAILs with the right gate (the harness's self-test on a real call).


def dropout(x: np.ndarray, sample_rate: int, seconds: float = 0.06) -> np.ndarray:
    """Sound cut dead for `seconds` at the loudest 10 ms of the speech (frames lost)."""
    y = np.array(x, dtype=np.float32)
    level = signals.frame_rms(y, sample_rate)
    if level.size:
        at = int(np.argmax(level)) * round(signals.FRAME_S * sample_rate)
        y[at : at + round(seconds * sample_rate)] = 0.0
    return y


def lowpass(x: np.ndarray, sample_rate: int, cutoff_hz: float = 3000.0) -> np.ndarray:
    """Muffled: everything above `cutoff_hz` removed (a narrowband hop on the way)."""
    spectrum = np.fft.rfft(np.asarray(x, dtype=np.float64))
    spectrum[np.fft.rfftfreq(len(x), 1 / sample_rate) > cutoff_hz] = 0
    return np.fft.irfft(spectrum, len(x)).astype(np.float32)


HEARD_FAULTS = {"silence": faults.insert_silence, "clip": faults.clip, "speed": faults.speed_up,
                "spike": faults.spike, "dropout": dropout, "lowpass": lowpass}  # fmt: skip
EXPECTED_GATE = {"silence": "max_gap", "clip": "clipping", "speed": "drift", "spike": "pop_click",
                 "dropout": "audible_dropouts", "lowpass": "hf_drop"}  # fmt: skip
