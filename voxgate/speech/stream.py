"""Driving a synchronous engine stream from asyncio: `EngineStream`, the one way every
transport (HTTP, the WebSocket gateway, the bridge, the agent) runs an engine.

It keeps at most one chunk in flight on a worker thread: generation of chunk n+1 overlaps the
sending of chunk n, and a cancel wastes at most the chunk in flight. On the `EnginePool`
each call carries its deadline from the listener's playback clock (`clock.py`): the first
chunk of a new utterance is due at once, a later chunk (or a later segment's first) when the
audio before it runs out. The engine gets the same time as the request's `play_at`, so a
batched engine can serve its rows by it. A pool with
`batch_s` (set for engines that compute in the calling thread) lets one call make several
later chunks, joined into one, while that is quick and no more urgent call waits: fewer hops
and messages per second of audio; the first chunk always comes alone. Text longer than
`max_piece_chars` reaches the engine piece by piece (`stream_pieces`), still as one stream:
one first chunk, one cancel, one timing, so no transport can hand an engine an unbounded text.

With the pool's `polled` on, an engine that offers `open_polled` (the batched qwen3 runner)
runs without a thread per stream: one pool call opens the stream (prompt, submission; or the event
loop itself, for an engine whose open never waits: `Engine.opens_at_once`), then the
engine wakes the event loop whenever it has handed the stream a frame, and `next()` takes what
is ready without blocking. Per frame that is one call into the loop instead of a worker
thread's wake-up, a future and the next call's submission (three GIL hand-overs a frame, with
64 streams ~800 a second). Text longer than `max_piece_chars` and other speaking rates go the
threaded way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from voxgate.engines.base import Engine, PolledStream, stream_pieces
from voxgate.speech.clock import PlaybackClock
from voxgate.speech.workers import EnginePool
from voxgate.types import AudioChunk, CancelToken, EngineFailure, SynthesisRequest, VoxgateError

log = logging.getLogger(__name__)


BATCH_BUDGET_S = 0.005  # a call joining chunks stops making more after this long


def join_chunks(parts: list[AudioChunk]) -> AudioChunk:
    """Consecutive chunks of one stream as one chunk."""
    if len(parts) == 1:
        return parts[0]
    starts = [p.unit_start for p in parts if p.unit_start is not None]
    ends = [p.unit_end for p in parts if p.unit_end is not None]
    pcm16 = [p.pcm16 for p in parts if p.pcm16 is not None]
    return AudioChunk(
        np.concatenate([p.samples for p in parts]),
        parts[0].sample_rate,
        parts[0].seq,
        starts[0] if starts else None,
        ends[-1] if ends else None,
        parts[-1].t_ready,
        np.concatenate(pcm16) if len(pcm16) == len(parts) else None,
        parts[0].marks,
    )


class LoopWaker:
    """Sets asyncio events of one loop from other threads, many per call into the loop: the
    first wake since the loop last ran schedules one callback, later ones join it (a runner
    handing 64 streams their frames wakes their loop once, not 64 times)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._events: list[asyncio.Event] = []

    def wake(self, event: asyncio.Event) -> None:
        with self._lock:
            self._events.append(event)
            if len(self._events) > 1:
                return  # a callback is already on its way
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        for event in events:
            event.set()


_WAKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWaker] = weakref.WeakKeyDictionary()
_WAKERS_LOCK = threading.Lock()


def _waker(loop: asyncio.AbstractEventLoop) -> LoopWaker:
    with _WAKERS_LOCK:
        waker = _WAKERS.get(loop)
        if waker is None:
            waker = _WAKERS[loop] = LoopWaker(loop)
        return waker


class EngineStream:
    """An engine's chunk iterator run on `pool`, one call ahead of the consumer.

    Work starts at construction, or with `start=False` at the first `start()`/`next()`, so
    a caller can put cached audio on the wire before the engine competes for the CPU.
    No engine call gets more than `max_piece_chars` characters of the request's text.
    `clock` is the listener's (the caller advances it as it sends audio); without one the
    stream keeps its own, advanced as chunks are made.
    """

    def __init__(
        self,
        engine: Engine,
        request: SynthesisRequest,
        pool: EnginePool,
        on_closed: Callable[[], None] | None = None,
        start: bool = True,
        max_piece_chars: int | None = None,
        clock: PlaybackClock | None = None,
    ) -> None:
        self.token = CancelToken()
        self.generated = 0
        self.priority = request.priority  # higher first on an EnginePool (the agent's live turn is high)
        self._own_clock = clock is None
        self.clock = clock if clock is not None else PlaybackClock()
        if request.play_at is None:
            request = replace(request, play_at=self.clock.due(time.perf_counter()), listener=self.clock)
        self._on_closed = on_closed
        self._closing = False
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        piece = max_piece_chars or pool.max_piece_chars  # the server's setting, carried by its pool
        self._iterator = stream_pieces(engine, request, self.token, piece)
        self._finished = False
        self._deferred: Exception | None = None  # an engine failure after audio made in the same call
        self.exhausted = False  # the engine ran to its end (as opposed to being cancelled)
        self._pending: asyncio.Future[AudioChunk | None] | None = None
        self._engine, self._request = engine, request
        polled = pool.polled and len(request.text) <= piece and request.speed == 1.0
        self._polled: bool | None = None if polled else False  # None: not yet known (the opening call says)
        self._source: PolledStream | None = None
        self._ready: deque[AudioChunk] = deque()
        self._woken = asyncio.Event()
        if start:
            self.start()

    def start(self) -> None:
        if self._pending is None and not self._closing:
            if self._polled is None and getattr(self._engine, "opens_at_once", False):
                self._pending = self._now(self._open)
                if self._polled is False:  # no polled stream after all: its first chunk is a worker's
                    self._pending = self._submit(self._next_in_worker)
                return
            work = self._open_in_worker if self._polled is None else self._next_in_worker
            self._pending = self._submit(work)

    def _now(self, fn: Callable[[], None]) -> asyncio.Future[AudioChunk | None]:
        """`fn` run here, on the event loop, its outcome as a done future (as a worker's would be).
        For an engine whose open never waits (`Engine.opens_at_once`): a burst of new streams then
        costs the loop no hop to a worker and back each, and the engine's own thread does not
        contend for the GIL with a worker per stream while it prefills the first of them."""
        future: asyncio.Future[AudioChunk | None] = self._loop.create_future()
        try:
            future.set_result(fn())
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _open(self) -> None:
        """Open the engine's polled stream; an engine without one is read by threads after all."""
        opener = getattr(self._engine, "open_polled", None)  # engines that only follow the protocol lack it
        source = opener(self._request, self.token, self._wake) if opener is not None else None
        self._source, self._polled = source, source is not None

    def _open_in_worker(self) -> AudioChunk | None:
        self._open()
        return None if self._polled else self._next_in_worker()

    def _wake(self) -> None:
        """From the engine's thread: let `next()` poll."""
        _waker(self._loop).wake(self._woken)

    def _submit(self, fn: Callable[[], object]) -> asyncio.Future:  # type: ignore[type-arg]
        """Run `fn` on the pool at this stream's priority and deadline (a close is due now)."""
        now = time.perf_counter()
        opens = self.generated == 0 and not self._closing
        deadline = now if self._closing else self.clock.due(now)
        return asyncio.wrap_future(self._pool.submit_at(deadline, self.priority, fn, opens_stream=opens))

    def _next_in_worker(self) -> AudioChunk | None:
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        chunk = self._produce()
        batch_s = self._pool.batch_s
        if chunk is None or self.generated == 1 or batch_s <= 0:
            return chunk
        parts, audio, started = [chunk], len(chunk.samples) / chunk.sample_rate, time.perf_counter()
        while audio < batch_s and time.perf_counter() - started < BATCH_BUDGET_S and not self.token.cancelled:
            if self._pool.more_urgent_waiting(self.priority, self.clock.due(time.perf_counter())):
                break
            try:
                more = self._produce()
            except Exception as exc:  # the audio made so far goes out first; the failure next time
                self._deferred = exc
                break
            if more is None:
                break
            parts.append(more)
            audio += len(more.samples) / more.sample_rate
        return join_chunks(parts)

    def _produce(self) -> AudioChunk | None:
        chunk = next(self._iterator, None)
        if chunk is not None:
            self.generated += 1
            if self._own_clock:
                self.clock.add(chunk.duration_s, time.perf_counter())
        return chunk

    async def next(self) -> AudioChunk | None:
        """The next chunk, or None at the end. Engine exceptions surface as EngineFailure."""
        self.start()
        if self._finished or self._pending is None:
            return None
        try:
            chunk = await asyncio.shield(self._pending)
            if self._source is not None:
                return await self._next_polled()
        except VoxgateError:  # a typed refusal from the engine (bad voice, language, ...) reaches the client as is
            self._finished = True
            raise
        except Exception as exc:  # an engine bug must not take the server down
            self._finished = True
            log.exception("engine stream failed")
            raise EngineFailure(f"{type(exc).__name__}: {exc}") from exc
        if chunk is None or self.token.cancelled:
            self._finished = True
            self.exhausted = chunk is None
            return None
        self._pending = self._submit(self._next_in_worker)
        return chunk

    async def _next_polled(self) -> AudioChunk | None:
        source = self._source
        assert source is not None
        while not self._ready:
            if self.token.cancelled:
                self._finished = True
                return None
            self._woken.clear()  # a wake after this sets it again: nothing handed out is missed
            self._ready.extend(source.poll())
            if self._ready:
                break
            if source.ended:
                self._finished = self.exhausted = True
                return None
            await self._woken.wait()
        chunk = self._ready.popleft()
        self.generated += 1
        if self._own_clock:
            self.clock.add(chunk.duration_s, time.perf_counter())
        return chunk

    def cancel(self, reason: str) -> None:
        """Stop the engine between chunks and close its iterator once no call is running."""
        self.token.cancel(reason)
        self._woken.set()  # a polled `next()` waiting for the engine returns now
        if self._pending is not None and not self._pending.done():
            self._pending.add_done_callback(lambda _: self._close())
        else:
            self._close()

    def _close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._pending is not None and not self._pending.cancelled():
            self._pending.exception()  # retrieved here, so asyncio does not warn about it
        if self._source is not None:  # polled: nothing runs on a thread; the engine frees the rest
            self._source.close()
            if self._on_closed is not None:
                self._on_closed()
            return
        self._submit(self._close_in_worker)  # due now: it frees the engine's resources

    def _close_in_worker(self) -> None:
        try:
            self._iterator.close()  # type: ignore[attr-defined]  # runs the engine's cleanup
        finally:
            if self._on_closed is not None:
                self._on_closed()
