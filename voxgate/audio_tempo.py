"""Speaking rate for engines that cannot change their own: audio stretched in time, pitch kept.

FFmpeg's `atempo` filter through PyAV (a dependency already): a WSOLA time-stretch that is the
reference implementation, streams (each chunk in, whatever is ready out) and costs ~1-15 ms a
second of 24 kHz audio on one core here. It takes factors from 0.5 up; slower rates chain two.
Writing our own would gain nothing.
"""

from __future__ import annotations

import av
import numpy as np
from av.filter import Graph

MIN_FACTOR = 0.25


class TempoStretch:
    """Float chunks at `sample_rate` -> the same speech `factor` times faster (0.25-4)."""

    def __init__(self, factor: float, sample_rate: int) -> None:
        if not MIN_FACTOR <= factor <= 4.0:
            raise ValueError(f"tempo factor must be within {MIN_FACTOR}-4, got {factor}")
        self.rate = sample_rate
        self._graph = Graph()
        node = self._graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono")
        self._source = node
        for step in [factor**0.5] * 2 if factor < 0.5 else [factor]:  # atempo takes >= 0.5 a stage
            stage = self._graph.add("atempo", f"{step:.6f}")
            node.link_to(stage)
            node = stage
        sink = self._graph.add("abuffersink")
        node.link_to(sink)
        self._graph.configure()
        self._pts = 0
        self._done = False

    def process(self, samples: np.ndarray) -> np.ndarray:
        """What is ready after these samples (possibly nothing while the filter fills)."""
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1),
                                           format="flt", layout="mono")  # fmt: skip
        frame.sample_rate, frame.pts = self.rate, self._pts
        self._pts += len(samples)
        self._graph.push(frame)
        return self._pull()

    def flush(self) -> np.ndarray:
        """The rest, once the input has ended."""
        if self._done:
            return np.zeros(0, dtype=np.float32)
        self._done = True
        self._graph.push(None)
        return self._pull()

    def _pull(self) -> np.ndarray:
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                break
            out.append(frame.to_ndarray().reshape(-1))
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)
