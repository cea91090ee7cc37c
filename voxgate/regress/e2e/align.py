"""Pre- vs post-transport audio of one reply, window by window (pure numpy).

The engine's capture is the reply's audio back to back; what arrives has the pauses the
track really played (a segment that was not ready yet is silence on the wire). One global
shift cannot line those up, so the reply is compared in windows: each window of the
capture is found in the received audio by normalised cross-correlation, searching from a
little before where the previous window matched (frames lost on the way) to `max_late_s`
after it (pauses added on the way), and the windows' log-mel distances are averaged over
their speech frames.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from voxgate.regress import signals

WINDOW_S = 0.5
EARLY_S = 0.3  # a window may match this much earlier than expected (frames lost on the way)
MAX_LATE_S = 2.0
MIN_NCC = 0.5  # a weaker correlation is no match (lost or garbled audio)


@dataclass(frozen=True, slots=True)
class Match:
    pre_start: int  # samples
    post_start: int
    mel_db: float  # mean |log-mel difference| over the window's speech frames
    ncc: float  # normalised correlation where it was found


def best_offset(piece: np.ndarray, region: np.ndarray) -> tuple[int, float]:
    """Where `piece` sits in `region` (offset >= 0) by normalised cross-correlation, and that
    correlation (1.0 = the same waveform). Raw correlation would prefer any louder place."""
    n, m = len(piece), len(region)
    if n == 0 or m < n:
        return 0, 0.0
    size = 1 << int(np.ceil(np.log2(n + m)))
    corr = np.fft.irfft(np.fft.rfft(region, size) * np.conj(np.fft.rfft(piece, size)), size)[: m - n + 1]
    c = np.concatenate([[0.0], np.cumsum(np.asarray(region, dtype=np.float64) ** 2)])
    energy = np.sqrt(np.maximum(c[n:] - c[:-n], 0.0) * float(np.sum(np.square(piece, dtype=np.float64))))
    ncc = corr / np.maximum(energy, 1e-12)
    best = int(np.argmax(ncc))
    return best, float(ncc[best])


def match_windows(pre: np.ndarray, post: np.ndarray, rate: int, post_end: int | None = None,
                  window_s: float = WINDOW_S, max_late_s: float = MAX_LATE_S) -> list[Match]:  # fmt: skip
    """Each speech window of `pre` matched in `post` (both at `rate`), in order; windows
    that would start at or past `post_end` (a reply cut there) are not compared. A window
    that matches nowhere (correlation < MIN_NCC) is compared where it was expected and does
    not move the expectation for the next."""
    pre, post = np.asarray(pre, dtype=np.float64), np.asarray(post, dtype=np.float64)
    win, early, late = round(window_s * rate), round(EARLY_S * rate), round(max_late_s * rate)
    limit = len(post) if post_end is None else min(post_end, len(post))
    voiced = signals.speech_frames(pre, rate)
    frame = round(signals.FRAME_S * rate)
    lag, out = _onset(post, rate) - _onset(pre, rate), []  # the reply's wait before its first sound, any length
    for start in range(0, max(len(pre) - win // 4, 0), win):
        piece = pre[start : start + win]
        first = start // frame
        if not voiced[first : first + len(piece) // frame].any():
            continue  # silence cannot be placed
        lo = max(0, start + lag - early)
        if lo >= limit:
            break
        piece = piece[: max(0, limit - start - lag)]  # only what was heard before a cut
        if len(piece) < win // 5:
            break
        offset, ncc = best_offset(piece, post[lo : start + lag + late + len(piece)])
        before = start + lag  # a pause added inside the window: its head still sits at the old lag
        at = lo + offset if ncc >= MIN_NCC else before
        mel = _mel_db(piece, _at(post, at, len(piece)), _at(post, before, len(piece)), rate)
        out.append(Match(start, at, mel, ncc))
        lag = at - start
    return out


def _onset(x: np.ndarray, rate: int) -> int:
    """The first speech frame's start, in samples (0 for none)."""
    voiced = np.flatnonzero(signals.speech_frames(x, rate))
    return int(voiced[0]) * round(signals.FRAME_S * rate) if voiced.size else 0


def _at(x: np.ndarray, start: int, n: int) -> np.ndarray:
    piece = x[start : start + n]
    return np.pad(piece, (0, n - len(piece)))


def _mel_db(reference: np.ndarray, test: np.ndarray, other: np.ndarray, rate: int) -> float:
    """Mean over the reference's speech frames of |log-mel difference| (dB), each frame
    taking the closer of two placements of the test (`test`, `other`)."""
    a = signals.log_mel(reference, rate)
    d = np.minimum(np.abs(a - signals.log_mel(test, rate)).mean(axis=1),
                   np.abs(a - signals.log_mel(other, rate)).mean(axis=1))  # fmt: skip
    speech = signals.speech_frames(reference, rate)[: len(a)]
    rows = np.flatnonzero(speech) if speech.any() else np.arange(len(a))
    return float(np.mean(d[rows])) if len(rows) else 0.0


def mel_distance_db(matches: list[Match]) -> float | None:
    """Mean of the windows' mel distances (dB); None when no window could be compared."""
    return float(np.mean([m.mel_db for m in matches])) if matches else None


def added_gap_s(matches: list[Match], rate: int) -> float:
    """The longest pause the way added between two windows that matched (how much later the
    next window was heard than the engine made it): a segment not ready, a stalled track."""
    found = [m for m in matches if m.ncc >= MIN_NCC]
    steps = [(b.post_start - b.pre_start) - (a.post_start - a.pre_start) for a, b in itertools.pairwise(found)]
    return max(0, *steps) / rate if steps else 0.0


def speech_s(x: np.ndarray, rate: int) -> float:
    """Seconds of speech frames: the length of what was said, whatever pauses were added."""
    return float(np.count_nonzero(signals.speech_frames(x, rate)) * signals.FRAME_S)


def drift_ratio(pre: np.ndarray, post: np.ndarray, rate: int) -> float | None:
    """Speech heard over speech made (1.0 = same pace; 0.9 = played 10% fast or 10% lost)."""
    made = speech_s(pre, rate)
    return speech_s(post, rate) / made if made > 0 else None
