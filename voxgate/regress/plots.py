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
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def waveform_spectrogram(
    audio: np.ndarray, sample_rate: int, title: str, path: Path, marks: Sequence[tuple[float, str]] = ()
) -> Path:
    """Waveform over spectrogram (dB), with vertical lines at `marks` (seconds, label)."""
    plt = _pyplot()
    y = np.nan_to_num(np.asarray(audio, dtype=np.float64))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.5), dpi=100, sharex=True)
    t = np.arange(y.size) / sample_rate
    top.plot(t, y, linewidth=0.4)
    top.set_ylim(-1.05, 1.05)
    top.set_ylabel("amplitude")
    top.set_title(title)
    if y.size >= 512:
        bottom.specgram(y, NFFT=512, Fs=sample_rate, noverlap=384, cmap="magma", scale="dB", vmin=-120)
    bottom.set_ylabel("Hz")
    bottom.set_xlabel("seconds")
    for at, label in marks:
        for ax in (top, bottom):
            ax.axvline(at, color="tab:cyan", linewidth=1.0)
        top.annotate(label, (at, 0.95), color="tab:cyan", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
