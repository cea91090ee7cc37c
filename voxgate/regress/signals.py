"""Audio checks a machine can judge, so no one has to listen. Pure numpy, no I/O.

Every function takes mono float samples in [-1, 1] (any float dtype) and, where time
matters, the sample rate. Each states its definition in its docstring; thresholds are not
here but in `gates.toml`. Frame measures use 10 ms frames unless said otherwise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from voxgate.audio import to_pcm16

SNR_CAP_DB = 120.0  # identical signals: a finite number JSON can carry (the seeds report 120 dB)
FRAME_S = 0.010
SPEECH_FLOOR_DB = -40.0  # a frame is speech when its RMS is within 40 dB of the loudest frame
ABS_FLOOR_RMS = 1e-3  # ... and above -60 dBFS


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def duration_s(x: np.ndarray, sample_rate: int) -> float:
    """Length in seconds: samples / rate."""
    return len(x) / sample_rate


def rms(x: np.ndarray) -> float:
    """Root mean square of the samples; 0.0 for no samples."""
    y = _f64(x)
    return float(np.sqrt(np.mean(y * y))) if y.size else 0.0


def _pcm16(x: np.ndarray) -> np.ndarray:
    """Exactly the PCM16 `voxgate.audio` writes (float32 arithmetic), NaN and inf as 0."""
    y = np.nan_to_num(np.asarray(x, dtype=np.float32).reshape(-1), posinf=0.0, neginf=0.0)
    return to_pcm16(y).astype("<i2")


def pcm_hash(x: np.ndarray) -> str:
    """SHA-256 of the samples as little-endian PCM16 (what a client receives), hex."""
    return hashlib.sha256(_pcm16(x).tobytes()).hexdigest()


def as_pcm16(x: np.ndarray) -> np.ndarray:
    """The samples as a client hears them: rounded to PCM16 and back to float (NaN -> 0), so
    audio compared with a stored WAV differs by nothing when it is the same."""
    return _pcm16(x).astype(np.float64) / 32767.0


def audio_problems(x: np.ndarray, sample_rate: int, min_duration_s: float = 0.1) -> list[str]:
    """Why a recording is unusable, as codes (empty list = usable):
    `empty` (no samples), `non_finite` (a NaN or inf sample), `silent` (every sample below
    1e-4 in magnitude: all zero or dither), `too_short` (under `min_duration_s`)."""
    y = np.asarray(x).reshape(-1)
    if y.size == 0:
        return ["empty"]
    problems = []
    finite = np.isfinite(y)
    if not finite.all():
        problems.append("non_finite")
    if not (np.abs(y[finite]) >= 1e-4).any():
        problems.append("silent")
    if duration_s(y, sample_rate) < min_duration_s:
        problems.append("too_short")
    return problems


def frame_rms(x: np.ndarray, sample_rate: int, frame_s: float = FRAME_S) -> np.ndarray:
    """RMS of consecutive non-overlapping frames (the last partial frame dropped)."""
    n = max(1, round(frame_s * sample_rate))
    y = np.nan_to_num(_f64(x))
    frames = y[: len(y) // n * n].reshape(-1, n)
    return np.sqrt(np.mean(frames * frames, axis=1))


def speech_frames(x: np.ndarray, sample_rate: int, frame_s: float = FRAME_S) -> np.ndarray:
    """Boolean per frame: RMS within 40 dB of the loudest frame and above -60 dBFS."""
    level = frame_rms(x, sample_rate, frame_s)
    if level.size == 0:
        return np.zeros(0, dtype=bool)
    floor = max(ABS_FLOOR_RMS, float(level.max()) * 10 ** (SPEECH_FLOOR_DB / 20))
    return level > floor


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) half-open index ranges of the True runs in a boolean array."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))


def max_silence_gap_s(x: np.ndarray, sample_rate: int) -> float:
    """Longest run of non-speech frames between the first and the last speech frame
    (leading and trailing silence do not count); 0.0 when there is no speech."""
    speech = speech_frames(x, sample_rate)
    voiced = np.flatnonzero(speech)
    if voiced.size == 0:
        return 0.0
    inside = ~speech[voiced[0] : voiced[-1] + 1]
    return max((e - s for s, e in _runs(inside)), default=0) * FRAME_S


def clipping_ratio(x: np.ndarray, level: float = 0.99, min_run: int = 3) -> float:
    """Fraction of samples in flat tops: runs of >= `min_run` consecutive samples with
    |x| >= `level` that stay within one PCM16 step of each other. A loud wave passes
    through its peak (its samples keep changing); a clipped one sits there."""
    y = np.abs(np.nan_to_num(_f64(x)))
    if y.size < 2:
        return 0.0
    flat = (y[1:] >= level) & (y[:-1] >= level) & (np.abs(np.diff(y)) <= 1.5 / 32767)
    clipped = sum(e - s + 1 for s, e in _runs(flat) if e - s + 1 >= min_run)
    return clipped / y.size


@dataclass(frozen=True, slots=True)
class Clicks:
    """`score`: the largest transient relative to its surroundings; `count`: samples scoring
    above the threshold; `worst_s`: where the largest one is."""

    score: float
    count: int
    worst_s: float


def _box_sum(v: np.ndarray, width: int) -> np.ndarray:
    """Sum of `v` over a centred window of `width` samples (edges padded with zeros)."""
    c = np.concatenate([[0.0], np.cumsum(v)])
    half = width // 2
    idx = np.arange(len(v))
    return c[np.minimum(idx + half + 1, len(v))] - c[np.maximum(idx - half, 0)]


def click_score(
    x: np.ndarray, sample_rate: int, threshold: float = 30.0, context_s: float = 0.02, floor: float = 0.01
) -> Clicks:
    """Pops and clicks: outliers of the second difference h[n] = x[n-1] - 2 x[n] + x[n+1]
    (a high-pass that speech, being mostly low-pass, barely excites).

    The background of h[n] is its RMS over a `context_s` window centred on n, leaving out the
    1 ms around n itself; the score is |h[n]| / max(background, `floor`). Speech and tones
    score up to about 12; a one-sample spike or a step at a chunk boundary scores 30 to 250.
    """
    y = np.nan_to_num(_f64(x))
    if y.size < 3:
        return Clicks(0.0, 0, 0.0)
    h = np.diff(y, n=2)
    h2 = h * h
    wide = max(3, round(context_s * sample_rate))
    guard = max(1, round(0.001 * sample_rate))
    background = (_box_sum(h2, wide) - _box_sum(h2, guard)) / max(1, wide - guard)
    ratio = np.abs(h) / np.maximum(np.sqrt(np.maximum(background, 0.0)), floor)
    worst = int(np.argmax(ratio))
    return Clicks(float(ratio[worst]), int(np.count_nonzero(ratio > threshold)), (worst + 1) / sample_rate)


@dataclass(frozen=True, slots=True)
class Spikes:
    """`count`: 10 ms frames that are booms; `max_abs_peak`: the largest |sample|;
    `first_s`: where the first boom starts (None without one)."""

    count: int
    max_abs_peak: float
    first_s: float | None


def spikes(x: np.ndarray, sample_rate: int, above_db: float = 20.0) -> Spikes:
    """Booms and bursts: 10 ms frames whose RMS is more than `above_db` over the median RMS
    of the speech frames (see `speech_frames`). Clean speech peaks about 16 dB over its
    median frame; a burst at full scale over speech at a third of it is 24 dB or more."""
    y = np.nan_to_num(_f64(x))
    level = frame_rms(y, sample_rate)
    speech = speech_frames(y, sample_rate)
    top = float(np.abs(y).max()) if y.size else 0.0
    if not speech.any():
        return Spikes(0, top, None)
    hits = np.flatnonzero(level > float(np.median(level[speech])) * 10 ** (above_db / 20))
    return Spikes(int(hits.size), top, float(hits[0]) * FRAME_S if hits.size else None)


def align_shift(reference: np.ndarray, test: np.ndarray, max_shift: int) -> int:
    """The delay of `test` against `reference` in samples (|shift| <= max_shift) that
    maximises their cross-correlation; positive = test starts later."""
    a, b = np.nan_to_num(_f64(reference)), np.nan_to_num(_f64(test))
    if a.size == 0 or b.size == 0 or max_shift <= 0:
        return 0
    size = 1 << int(np.ceil(np.log2(a.size + b.size)))
    max_shift = min(max_shift, size // 2 - 1)
    corr = np.fft.irfft(np.fft.rfft(b, size) * np.conj(np.fft.rfft(a, size)), size)
    lags = np.concatenate([np.arange(0, max_shift + 1), np.arange(-max_shift, 0)])
    return int(lags[int(np.argmax(corr[lags]))])


def snr_db(reference: np.ndarray, test: np.ndarray, sample_rate: int, max_shift_s: float = 0.05) -> float:
    """10 log10(sum ref^2 / sum (ref - test)^2) after shifting `test` by the best lag within
    `max_shift_s`. Samples only one side has count as error, so a longer or shorter test
    loses SNR. Capped to +-120 dB (identical = 120)."""
    ref = np.nan_to_num(_f64(reference))
    shift = align_shift(ref, test, round(max_shift_s * sample_rate))
    t = np.nan_to_num(_f64(test))
    t = t[shift:] if shift >= 0 else np.concatenate([np.zeros(-shift), t])
    n = max(len(ref), len(t))
    err = np.pad(ref, (0, n - len(ref))) - np.pad(t, (0, n - len(t)))
    signal, noise = float(np.sum(ref * ref)), float(np.sum(err * err))
    if noise == 0.0:
        return SNR_CAP_DB
    if signal == 0.0:
        return -SNR_CAP_DB
    return float(np.clip(10 * np.log10(signal / noise), -SNR_CAP_DB, SNR_CAP_DB))


def _mel_filters(sample_rate: int, n_fft: int, n_mels: int, fmax: float) -> np.ndarray:
    """Triangular filters evenly spaced on the HTK mel scale, shape (n_mels, n_fft // 2 + 1)."""

    def mel(f: np.ndarray) -> np.ndarray:
        return 2595 * np.log10(1 + f / 700)

    points = 700 * (10 ** (np.linspace(0, mel(np.array(fmax)), n_mels + 2) / 2595) - 1)
    freqs = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    lo, mid, hi = points[:-2, None], points[1:-1, None], points[2:, None]
    up = (freqs - lo) / np.maximum(mid - lo, 1e-9)
    down = (hi - freqs) / np.maximum(hi - mid, 1e-9)
    return np.maximum(0.0, np.minimum(up, down))


def power_spectrogram(x: np.ndarray, sample_rate: int, win_s: float = 0.032, hop_s: float = FRAME_S) -> np.ndarray:
    """|STFT|^2 with a Hann window, shape (frames, n_fft // 2 + 1); no frames if too short."""
    y = np.nan_to_num(_f64(x))
    win, hop = round(win_s * sample_rate), max(1, round(hop_s * sample_rate))
    n_fft = 1 << int(np.ceil(np.log2(win)))
    if len(y) < win:
        return np.zeros((0, n_fft // 2 + 1))
    starts = np.arange(0, len(y) - win + 1, hop)
    frames = y[starts[:, None] + np.arange(win)] * np.hanning(win)
    return np.abs(np.fft.rfft(frames, n_fft, axis=1)) ** 2


def log_mel(x: np.ndarray, sample_rate: int, n_mels: int = 40, hop_s: float = FRAME_S) -> np.ndarray:
    """Log mel energies in dB (floored at -100 dB), shape (frames, n_mels), up to 8 kHz."""
    power = power_spectrogram(x, sample_rate, hop_s=hop_s)
    n_fft = (power.shape[1] - 1) * 2
    filters = _mel_filters(sample_rate, n_fft, n_mels, min(8000.0, sample_rate / 2))
    return 10 * np.log10(np.maximum(power @ filters.T, 1e-10))


def mel_distance_db(reference: np.ndarray, test: np.ndarray, sample_rate: int, max_shift_s: float = 0.05) -> float:
    """Mean |log-mel difference| in dB over the reference's speech frames, after aligning
    `test` as `snr_db` does; frames missing from `test` count as silence (-100 dB).
    Both recordings at the same rate (resample first, see `voxgate.audio.resample`)."""
    ref = np.nan_to_num(_f64(reference))
    shift = align_shift(ref, test, round(max_shift_s * sample_rate))
    t = np.nan_to_num(_f64(test))
    t = t[shift:] if shift >= 0 else np.concatenate([np.zeros(-shift), t])
    a, b = log_mel(ref, sample_rate), log_mel(np.pad(t, (0, max(0, len(ref) - len(t))))[: len(ref)], sample_rate)
    if a.size == 0:
        return 0.0
    speech = speech_frames(ref, sample_rate)[: len(a)]
    rows = np.flatnonzero(speech) if speech.any() else np.arange(len(a))
    rows = rows[rows < len(a)]
    return float(np.mean(np.abs(a[rows] - b[rows])))


def hf_energy_ratio(x: np.ndarray, sample_rate: int, band: tuple[float, float] = (4000.0, 8000.0)) -> float:
    """Energy in `band` (Hz; cut at Nyquist) over the total energy; 0.0 for silence."""
    power = power_spectrogram(x, sample_rate).sum(axis=0)
    total = float(power.sum())
    if total <= 0.0:
        return 0.0
    freqs = np.linspace(0, sample_rate / 2, len(power))
    return float(power[(freqs >= band[0]) & (freqs < band[1])].sum() / total)


def hf_ratio_drop_db(reference: np.ndarray, test: np.ndarray, sample_rate: int) -> float:
    """How much the 4-8 kHz share fell from reference to test, in dB (> 0 = duller:
    muffled or low-passed on the way)."""
    a, b = hf_energy_ratio(reference, sample_rate), hf_energy_ratio(test, sample_rate)
    return float(10 * np.log10(max(a, 1e-12) / max(b, 1e-12)))


@dataclass(frozen=True, slots=True)
class Repeat:
    """The longest stretch of speech heard twice: `duration_s` long, first at `first_s`,
    again at `second_s` (all 0.0 when none)."""

    duration_s: float
    first_s: float
    second_s: float


def find_repeat(
    x: np.ndarray, sample_rate: int, min_s: float = 0.3, similarity: float = 0.9, speech_db: float = -30.0
) -> Repeat:
    """Repeated segments (a decoder stuck in a loop says a piece again).

    Frames are 10 ms log power spectra up to 5 kHz (fine enough to tell pitches apart),
    mean-normalised over the recording and scaled to unit length. Frames i and j match when
    both are speech (within `speech_db` of the loudest frame) and their cosine similarity is
    >= `similarity`, or when both are not speech. A repeat is a run of matches along one
    lag L = j - i >= `min_s` (so it does not overlap itself) that holds >= `min_s` of
    speech matches. Cost: O(frames^2), about 0.1 s for 10 s of audio.
    """
    power = power_spectrogram(x, sample_rate)
    freqs = np.linspace(0, sample_rate / 2, power.shape[1])
    feats = 10 * np.log10(np.maximum(power[:, freqs < 5000.0], 1e-10))
    n = len(feats)
    min_frames = max(1, round(min_s / FRAME_S))
    if n < 2 * min_frames:
        return Repeat(0.0, 0.0, 0.0)
    level = frame_rms(x, sample_rate)[:n]
    speech = np.pad(level > max(ABS_FLOOR_RMS, float(level.max()) * 10 ** (speech_db / 20)), (0, n - len(level)))
    feats = feats - feats.mean(axis=0)
    feats /= np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-9)
    sim = feats @ feats.T
    best = (0, 0, 0)
    for lag in range(min_frames, n - min_frames + 1):
        match = (np.diagonal(sim, lag) >= similarity) & speech[: n - lag] & speech[lag:]
        quiet = ~speech[: n - lag] & ~speech[lag:]
        counted = np.concatenate([[0], np.cumsum(match)])
        for start, end in _runs(match | quiet):
            if counted[end] - counted[start] >= min_frames and end - start > best[0]:
                best = (end - start, start, start + lag)
    frames, first, second = best
    return Repeat(frames * FRAME_S, first * FRAME_S, second * FRAME_S)
