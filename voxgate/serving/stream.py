"""Driving a synchronous engine stream from asyncio, and streaming it to an HTTP client.

`EngineStream` keeps at most one chunk in flight on a worker thread: generation of chunk
n+1 overlaps the sending of chunk n, and a cancel wastes at most the chunk in flight. On the
`EnginePool` each call carries its deadline: the first chunk is due at once, a later one when
the audio produced so far would run out if playback started with the first chunk. A pool
with `batch_s` (set for engines that compute in the calling thread) lets one call make
several later chunks, joined into one, while that is quick and no more urgent call waits:
fewer hops and messages per second of audio; the first chunk always comes alone.
Text longer than `max_piece_chars` reaches the engine piece by piece (`stream_pieces`), still
as one stream: one first chunk, one cancel, one timing. Every transport drives its engine
through this class, so none of them can hand an engine an unbounded text.
`DisconnectWatch` notices a client leaving from the moment its request is admitted.
`AudioStreamResponse` writes the pieces, stamps server-side timing, gives up on a client
that stops reading, and ends a broken stream without the closing chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import numpy as np
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from voxgate.engines.base import Engine, stream_pieces
from voxgate.serving.workers import EnginePool
from voxgate.types import AudioChunk, CancelToken, EngineFailure, SynthesisRequest, Timing, VoxgateError

log = logging.getLogger(__name__)


BATCH_BUDGET_S = 0.005  # a call joining chunks stops making more after this long


def join_chunks(parts: list[AudioChunk]) -> AudioChunk:
    """Consecutive chunks of one stream as one chunk."""
    if len(parts) == 1:
        return parts[0]
    starts = [p.unit_start for p in parts if p.unit_start is not None]
    ends = [p.unit_end for p in parts if p.unit_end is not None]
    return AudioChunk(
        np.concatenate([p.samples for p in parts]),
        parts[0].sample_rate,
        parts[0].seq,
        starts[0] if starts else None,
        ends[-1] if ends else None,
        parts[-1].t_ready,
    )


class EngineStream:
    """An engine's chunk iterator run on `pool`, one call ahead of the consumer.

    Work starts at construction, or with `start=False` at the first `start()`/`next()`, so
    a caller can put cached audio on the wire before the engine competes for the CPU.
    No engine call gets more than `max_piece_chars` characters of the request's text.
    """

    def __init__(
        self,
        engine: Engine,
        request: SynthesisRequest,
        pool: EnginePool,
        on_closed: Callable[[], None] | None = None,
        start: bool = True,
        max_piece_chars: int | None = None,
    ) -> None:
        self.token = CancelToken()
        self.generated = 0
        self.priority = request.priority  # higher first on an EnginePool (the agent's live turn is high)
        self._t_first: float | None = None  # when the first chunk was ready
        self._audio_s = 0.0  # seconds of audio produced so far
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
        if start:
            self.start()

    def start(self) -> None:
        if self._pending is None and not self._closing:
            self._pending = self._submit(self._next_in_worker)

    def _submit(self, fn: Callable[[], object]) -> asyncio.Future:  # type: ignore[type-arg]
        """Run `fn` on the pool at this stream's priority and deadline (a close is due now)."""
        now = time.perf_counter()
        opens = self._t_first is None and not self._closing
        deadline = now if self._t_first is None or self._closing else self._t_first + self._audio_s
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
            if self._pool.more_urgent_waiting(self.priority, self._t_first + self._audio_s):
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
            self._audio_s += len(chunk.samples) / chunk.sample_rate
            if self._t_first is None:
                self._t_first = time.perf_counter()
        return chunk

    async def next(self) -> AudioChunk | None:
        """The next chunk, or None at the end. Engine exceptions surface as EngineFailure."""
        self.start()
        if self._finished or self._pending is None:
            return None
        try:
            chunk = await asyncio.shield(self._pending)
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

    def cancel(self, reason: str) -> None:
        """Stop the engine between chunks and close its iterator once no call is running."""
        self.token.cancel(reason)
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
        self._submit(self._close_in_worker)  # due now: it frees the engine's resources

    def _close_in_worker(self) -> None:
        try:
            self._iterator.close()  # type: ignore[attr-defined]  # runs the engine's cleanup
        finally:
            if self._on_closed is not None:
                self._on_closed()


class DisconnectWatch:
    """Sets `gone` (and runs the callbacks) when the client disconnects."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()
        for callback in self._callbacks:
            callback()

    def on_gone(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def stop(self) -> None:
        """Stop watching (the response is over; uvicorn reports a disconnect after it too)."""
        self._task.cancel()


@dataclass(slots=True)
class StreamOutcome:
    timing: Timing
    status: str = "completed"  # completed | client_disconnect | send_timeout | failed


class AudioStreamResponse(Response):
    """Streams `body` (already-encoded pieces) and reports how it ended via `on_finish`."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        outcome: StreamOutcome,
        watch: DisconnectWatch,
        on_finish: Callable[[StreamOutcome], None],
        headers: dict[str, str],
        media_type: str,
        send_timeout_s: float,
    ) -> None:
        self.body_iterator = body
        self.outcome = outcome
        self.watch = watch
        self.on_finish = on_finish
        self.send_timeout_s = send_timeout_s
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome, timing = self.outcome, self.outcome.timing
        self._complete = False
        try:
            async with anyio.create_task_group() as group:

                async def stop_when_gone() -> None:
                    await self.watch.gone.wait()
                    if not self._complete:
                        outcome.status = "client_disconnect"
                        group.cancel_scope.cancel()

                group.start_soon(stop_when_gone)
                await self._send_all(send)
                group.cancel_scope.cancel()
        except Exception as exc:
            while isinstance(exc, ExceptionGroup):  # the task group wraps what the body raised
                exc = exc.exceptions[0]
            if isinstance(exc, TimeoutError):
                outcome.status = "send_timeout"
                log.warning("client stopped reading for %.0f s; dropping the stream", self.send_timeout_s)
            else:
                outcome.status = "failed"
                timing.error_code = getattr(exc, "code", "internal_error")
            # Returning without the closing chunk makes uvicorn drop the connection, so the
            # client sees a truncated body, never a clean end of a broken stream.
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            timing.t_done = time.perf_counter()
            self.watch.stop()
            self.on_finish(outcome)

    async def _send(self, send: Send, message: dict[str, object]) -> None:
        async with asyncio.timeout(self.send_timeout_s):
            await send(message)

    async def _send_all(self, send: Send) -> None:
        timing = self.outcome.timing
        await self._send(send, {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for piece in self.body_iterator:
            await self._send(send, {"type": "http.response.body", "body": piece, "more_body": True})
            if timing.t_first_audio_out is None and not self.watch.gone.is_set():
                timing.t_first_audio_out = time.perf_counter()
            timing.chunks_sent += 1
            await asyncio.sleep(0)  # let the disconnect watch run between pieces
        self._complete = True
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
