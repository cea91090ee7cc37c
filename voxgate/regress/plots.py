"""Report figures (matplotlib, Agg backend: no display needed): latency CDF, and the
waveform with its spectrogram for a recording that failed a gate."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _pyplot():  # imported on first use: the rest of the harness runs without matplotlib loaded
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(ttfa_ms: Sequence[float], threshold_ms: float | None, path: Path) -> Path:
    """Empirical CDF of the time to first audio, with the gate's threshold as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=80)
    fig.subplots_adjust(left=0.12, right=0.97, top=0.95, bottom=0.16)
    values = np.sort(np.asarray(ttfa_ms, dtype=np.float64))
    if values.size:
        ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=f"{values.size} requests")
    if threshold_ms is not None:
        ax.axvline(threshold_ms, color="tab:red", linestyle="--", label=f"gate {threshold_ms:g} ms")
    ax.set_xlabel("time to first audio (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.savefig(path)
    plt.close(fig)
    return path


def _envelope(y: np.ndarray, columns: int = 1500) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(column index, min, max) of `y` in `columns` pieces: what a waveform plot can show."""
    n = max(1, len(y) // columns)
    pieces = y[: len(y) // n * n].reshape(-1, n)
    return np.arange(len(pieces)) * n, pieces.min(axis=1), pieces.max(axis=1)


def waveform_spectrogram(
    audio: np.ndarray, sample_rate: int, title: str, path: Path, marks: Sequence[tuple[float, str]] = ()
) -> Path:
    """Waveform (min/max envelope) over spectrogram (dB), with vertical lines at `marks`
    (seconds, label)."""
    from voxgate.regress.signals import power_spectrogram

    plt = _pyplot()
    y = np.nan_to_num(np.asarray(audio, dtype=np.float64))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.5), dpi=80, sharex=True)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.92, bottom=0.1, hspace=0.08)
    if y.size:
        at, low, high = _envelope(y)
        top.fill_between(at / sample_rate, low, high, linewidth=0.5)
    top.set_ylim(-1.05, 1.05)
    top.set_ylabel("amplitude")
    top.set_title(title)
    power = power_spectrogram(y, sample_rate)
    if power.size:
        db = 10 * np.log10(np.maximum(power.T, 1e-12))
        bottom.imshow(db, origin="lower", aspect="auto", cmap="magma", vmin=db.max() - 90, vmax=db.max(),
                      extent=(0, y.size / sample_rate, 0, sample_rate / 2))  # fmt: skip
    bottom.set_ylabel("Hz")
    bottom.set_xlabel("seconds")
    for at_s, label in marks:
        for ax in (top, bottom):
            ax.axvline(at_s, color="tab:cyan", linewidth=1.0)
        top.annotate(label, (at_s, 0.9), color="tab:cyan", fontsize=8)
    fig.savefig(path)
    plt.close(fig)
    return path
