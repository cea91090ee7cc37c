"""Outbound audio framing for WebRTC, pure (no I/O, no clock): PCM chunks of any rate in,
20 ms frames of 48 kHz int16 out, each carrying its tag, with end markers and flush.
`voxgate.agent.webrtc.OutboundAudio` publishes them in real time."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from voxgate.audio import Resampler, to_pcm16
from voxgate.types import InvalidRequest

RATE = 48000  # what WebRTC's Opus carries
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FRAME_S = FRAME_SAMPLES / RATE


@dataclass(slots=True)
class Frame:
    """20 ms of int16 audio at 48 kHz and the tag it carries."""

    pcm: np.ndarray  # int16, FRAME_SAMPLES
    tag: Hashable
    samples: int  # real audio in it; the rest is padding at the end of a tag's audio


@dataclass(slots=True)
class EndMark:
    """`end(tag)`: reached once everything before it was published."""

    tag: Hashable


@dataclass(slots=True)
class Tick:
    """What one 20 ms publication carries: a frame (None = silence) and the end markers
    reached before and after it."""

    frame: Frame | None
    drained_before: list[Hashable] = field(default_factory=list)
    drained_after: list[Hashable] = field(default_factory=list)


class FrameQueue:
    """The pure part of `OutboundAudio`: PCM chunks in, 20 ms frames at 48 kHz out.

    A tag's audio is one stream: its chunks go through one resampler, and a frame is only
    cut when 20 ms are there, so the tail of a chunk waits for the next one. `end(...)` (or
    audio of another tag, or another rate) closes the stream: its filter is drained and the
    last partial frame padded with zeros.
    """

    def __init__(self) -> None:
        self._items: deque[Frame | EndMark] = deque()
        self._open_tag: Hashable = None
        self._resampler: Resampler | None = None
        self._partial = np.zeros(0, dtype=np.float32)

    def __len__(self) -> int:
        """Frames queued (end markers not counted)."""
        return sum(1 for item in self._items if isinstance(item, Frame))

    @property
    def queued_s(self) -> float:
        """Audio queued, in seconds (whole frames, and the partial one held)."""
        return len(self) * FRAME_S + len(self._partial) / RATE

    def enqueue(self, pcm: np.ndarray, sample_rate: int, tag: Hashable) -> None:
        samples = _mono_float(pcm)
        if not isinstance(sample_rate, int) or sample_rate <= 0:
            raise InvalidRequest(f"sample rate must be a positive integer, got {sample_rate!r}")
        if self._resampler is None or tag != self._open_tag or sample_rate != self._resampler.in_rate:
            self._close_stream()
            self._open_tag, self._resampler = tag, Resampler(sample_rate, RATE)
        self._add(self._resampler.process(samples))

    def end(self, tag: Hashable) -> None:
        """A barrier: everything enqueued so far (whatever its tag, the held tail included)
        goes out before the marker."""
        self._close_stream()
        self._items.append(EndMark(tag))

    def flush(self, tag: Hashable = None) -> int:
        """Drop queued frames and end markers (all, or only `tag`'s); return the frames
        dropped (a held partial frame counts as one)."""
        everything = tag is None
        dropped = 0
        if self._resampler is not None and (everything or tag == self._open_tag):
            dropped += int(len(self._partial) > 0)
            self._open_tag, self._resampler, self._partial = None, None, np.zeros(0, dtype=np.float32)
        kept: deque[Frame | EndMark] = deque()
        for item in self._items:
            if everything or item.tag == tag:
                dropped += isinstance(item, Frame)
            else:
                kept.append(item)
        self._items = kept
        return dropped

    def pop(self) -> Tick:
        """The next 20 ms: a frame if one is queued (else silence), with the end markers met."""
        tick = Tick(None)
        items = self._items
        while items and isinstance(items[0], EndMark):
            tick.drained_before.append(items.popleft().tag)
        if items:
            tick.frame = items.popleft()  # type: ignore[assignment]  # a frame: the markers were taken above
            while items and isinstance(items[0], EndMark):
                tick.drained_after.append(items.popleft().tag)
        return tick

    def _add(self, samples: np.ndarray) -> None:
        audio = np.concatenate([self._partial, samples]) if self._partial.size else samples
        full = len(audio) // FRAME_SAMPLES * FRAME_SAMPLES
        for i in range(0, full, FRAME_SAMPLES):
            self._items.append(Frame(to_pcm16(audio[i : i + FRAME_SAMPLES]), self._open_tag, FRAME_SAMPLES))
        self._partial = np.array(audio[full:], dtype=np.float32)

    def _close_stream(self) -> None:
        if self._resampler is None:
            return
        tail = np.concatenate([self._partial, self._resampler.flush()])
        if tail.size:
            for i in range(0, len(tail), FRAME_SAMPLES):
                piece = tail[i : i + FRAME_SAMPLES]
                padded = np.zeros(FRAME_SAMPLES, dtype=np.float32)
                padded[: len(piece)] = piece
                self._items.append(Frame(to_pcm16(padded), self._open_tag, len(piece)))
        self._open_tag, self._resampler, self._partial = None, None, np.zeros(0, dtype=np.float32)


def _mono_float(pcm: np.ndarray) -> np.ndarray:
    pcm = np.asarray(pcm)
    if pcm.ndim != 1:
        raise InvalidRequest(f"audio must be mono (1-D), got shape {pcm.shape}")
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32767.0
    if not np.issubdtype(pcm.dtype, np.floating):
        raise InvalidRequest(f"audio must be float in [-1, 1] or int16, got {pcm.dtype}")
    return pcm.astype(np.float32, copy=False)
