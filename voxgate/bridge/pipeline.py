"""LLM reply -> speech, overlapped: the reply's text deltas go through the segmenter while the
LLM is still writing (producer), and the segments are synthesised and handed out in order
(consumer), the next segment's synthesis starting while the current one is still being
handed out. `cancel()` (barge-in) stops the LLM stream and every engine stream at once and
`spoken()` says what was handed out, for the conversation history.

Backpressure policy, when segments arrive faster than they are spoken: `block` (default)
keeps them all and speaks them in turn; `latest` drops main segments waiting behind newer
ones (a stale sentence is not worth the delay), never the starter or the final segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from voxgate.bridge.segmenter import Segment, Segmenter
from voxgate.text import split_units
from voxgate.types import AudioChunk

Policy = Literal["block", "latest"]


class ChunkStream(Protocol):
    """What the pipeline needs of an engine stream (`speech.stream.EngineStream` is one)."""

    async def next(self) -> AudioChunk | None: ...

    def cancel(self, reason: str) -> None: ...


@dataclass
class PipelineStats:
    segments: int = 0
    dropped: int = 0
    unspeakable: int = 0  # segments with nothing to say (a reply ending in emoji or markup): no engine call
    queue_peak: int = 0
    first_cut_at: float | None = None  # perf_counter() when the segmenter gave the first segment
    triggers: dict[str, int] = field(default_factory=dict)


class ReplyPipeline:
    def __init__(
        self,
        synthesise: Callable[[Segment], ChunkStream],
        segmenter: Segmenter | None = None,
        policy: Policy = "block",
    ) -> None:
        self.synthesise = synthesise
        self.segmenter = segmenter or Segmenter()
        self.policy = policy
        self.stats = PipelineStats()
        self._queue: deque[Segment] = deque()
        self._arrived = asyncio.Event()
        self._stopped = asyncio.Event()
        self._llm_done = False
        self._cancelled = False
        self._streams: list[ChunkStream] = []
        self._producer: asyncio.Task[None] | None = None
        self._spoken: list[str] = []  # text of segments handed out whole
        self._partial: str = ""  # the segment being handed out when cancelled
        self.error: BaseException | None = None  # the LLM stream's failure, if any
        self.stopped_at: float | None = None  # perf_counter() of the first cancel()

    async def run(self, deltas: AsyncIterator[str]) -> AsyncIterator[tuple[Segment, AudioChunk]]:
        """(segment, chunk) in reply order until the reply is spoken or `cancel()`."""
        self._producer = asyncio.get_running_loop().create_task(self._produce(deltas))
        try:
            current = await self._next_segment()
            upcoming: tuple[Segment, ChunkStream] | None = None
            stream = self._open(current) if current else None
            while current is not None and stream is not None and not self._cancelled:
                while (chunk := await self._next_chunk(stream)) is not None and not self._cancelled:
                    if upcoming is None and self._queue:  # overlap: the next segment starts now
                        nxt = self._take()
                        upcoming = (nxt, self._open(nxt)) if nxt else None
                    self._partial = current.text
                    yield current, chunk
                if self._cancelled:
                    break
                self._spoken.append(current.text)
                self._partial = ""
                if upcoming is None:
                    nxt = await self._next_segment()
                    upcoming = (nxt, self._open(nxt)) if nxt else None
                current, stream = upcoming if upcoming else (None, None)
                upcoming = None
        finally:
            self.cancel() if self._cancelled else self._stop_producer()
            if self.error is not None and not self._cancelled:
                raise self.error

    def cancel(self) -> None:
        """Barge-in: stop the LLM stream and all synthesis now."""
        if not self._cancelled:
            self.stopped_at = time.perf_counter()
        self._cancelled = True
        for stream in self._streams:
            stream.cancel("barge_in")
        self._stop_producer()
        self._arrived.set()
        self._stopped.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def stopped(self) -> asyncio.Event:
        """Set by `cancel()`: something to wait on alongside other work."""
        return self._stopped

    def spoken(self) -> str:
        """The reply as far as it was handed out (a cut segment included up to where it stopped)."""
        return " ".join([*self._spoken, *([self._partial] if self._partial else [])])

    # ------------------------------------------------------------------ inside

    async def _produce(self, deltas: AsyncIterator[str]) -> None:
        try:
            async for delta in deltas:
                self._add(self.segmenter.push(delta))
            self._add(self.segmenter.flush())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # what arrived is still spoken; the consumer raises after it
            self.error = exc
            self._add(self.segmenter.flush())
        finally:
            self._llm_done = True
            self._arrived.set()

    def _add(self, segments: list[Segment]) -> None:
        if segments and self.stats.first_cut_at is None:
            self.stats.first_cut_at = time.perf_counter()
        for segment in segments:
            self.stats.triggers[segment.trigger] = self.stats.triggers.get(segment.trigger, 0) + 1
            if not segment.speakable:
                self.stats.unspeakable += 1  # "🎉🎉🎉" at the end: the segmenter joins any other to its neighbour
                continue
            if self.policy == "latest":
                stale = [s for s in self._queue if s.kind == "main"]
                self.stats.dropped += len(stale)
                self._queue = deque(s for s in self._queue if s.kind != "main")
            self._queue.append(segment)
            self.stats.queue_peak = max(self.stats.queue_peak, len(self._queue))
        if segments:
            self._arrived.set()

    async def _next_chunk(self, stream: ChunkStream) -> AudioChunk | None:
        """The stream's next chunk, or None at once on `cancel()` (not after the chunk in flight)."""
        if self._cancelled:
            return None
        chunk = asyncio.ensure_future(stream.next())
        stop = asyncio.ensure_future(self._stopped.wait())
        await asyncio.wait((chunk, stop), return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not chunk.done():
            chunk.cancel()  # the engine's own work stops through stream.cancel()
            return None
        return chunk.result()

    def _take(self) -> Segment | None:
        return self._queue.popleft() if self._queue else None

    async def _next_segment(self) -> Segment | None:
        while not self._queue and not self._llm_done and not self._cancelled:
            self._arrived.clear()
            await self._arrived.wait()
        return None if self._cancelled else self._take()

    def _open(self, segment: Segment) -> ChunkStream:
        self.stats.segments += 1
        stream = self.synthesise(segment)
        self._streams.append(stream)
        return stream

    def _stop_producer(self) -> None:
        if self._producer is not None and not self._producer.done():
            self._producer.cancel()
        with contextlib.suppress(Exception):
            for stream in self._streams:
                stream.cancel("done")


def heard_text(spans: list[tuple[str, float]], played_s: float) -> str:
    """What a listener heard of a reply stopped after `played_s` seconds of its audio.

    `spans` are the segments handed out, in order: (text, seconds of audio). A segment played
    to its end counts whole; of the one playing at the stop, the words whose share of its
    audio (words and CJK characters taken as equally long) had fully played.
    """
    heard, left = [], max(0.0, played_s)
    for text, seconds in spans:
        if left >= seconds:
            heard.append(text)
            left -= seconds
            continue
        units = split_units(text)
        done = int(len(units) * left / seconds + 1e-9) if seconds > 0 else 0  # 1e-9: float sums
        if done:
            heard.append(text[: units[done - 1].end])
        break
    return " ".join(heard)
