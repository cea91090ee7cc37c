"""Pre-transport capture: the audio the agent handed its track for one reply, kept as a WAV
named by the reply's trace id (opt-in: `VOXGATE_AGENT_CAPTURE_DIR`).

The regression harness (`voxgate regress e2e`) compares it with what the caller heard after
WebRTC. The driver saves it in its reply's `finally`, so a reply cut by a barge-in or a
hang-up keeps the audio it had enqueued.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from voxgate.audio import resample, wav_bytes

log = logging.getLogger(__name__)


class ReplyCapture:
    """Collects one reply's audio (any rates; kept at the first chunk's) and writes
    `<directory>/<trace_id>.wav`."""

    def __init__(self, directory: Path, trace_id: str) -> None:
        self.path = directory / f"{trace_id}.wav"
        self.rate = 0
        self._pieces: list[np.ndarray] = []

    def add(self, samples: np.ndarray, sample_rate: int) -> None:
        self.rate = self.rate or sample_rate
        pcm = samples.astype(np.float32) / 32767.0 if samples.dtype == np.int16 else samples.astype(np.float32)
        self._pieces.append(pcm if sample_rate == self.rate else resample(pcm, sample_rate, self.rate))

    def save(self) -> Path | None:
        """Write the WAV (synchronously: it must not wait on a cancelled task); None when the
        reply had no audio or the file cannot be written (logged, never raised)."""
        if not self._pieces:
            return None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(wav_bytes(np.concatenate(self._pieces), self.rate))
        except OSError as exc:
            log.warning("reply capture %s not written: %s", self.path, exc)
            return None
        return self.path
