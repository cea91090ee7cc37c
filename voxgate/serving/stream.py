"""Driving a synchronous engine stream from asyncio, and streaming it to an HTTP client.

`EngineStream` keeps exactly one chunk in flight on a worker thread (pipelining generation
with sending, and bounding wasted work on cancel to that one chunk). `AudioStreamResponse`
writes pieces, stamps server-side timing, and cancels the engine the moment the client
disconnects rather than at its next write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from voxgate.engines.base import Engine
from voxgate.types import AudioChunk, Busy, CancelToken, EngineFailure, SynthesisRequest, Timing, TooManyStreams

log = logging.getLogger(__name__)


class EngineStream:
    """An engine's chunk iterator run on `executor`, one chunk ahead of the consumer.

    Work starts at construction, or with `start=False` at the first `start()`/`next()`, so
    a caller can put cached audio on the wire before the engine competes for the CPU.
    """

    def __init__(
        self,
        engine: Engine,
        request: SynthesisRequest,
        executor: Executor,
        on_closed: Callable[[], None] | None = None,
        start: bool = True,
    ) -> None:
        self.token = CancelToken()
        self.generated = 0
        self._on_closed = on_closed
        self._closing = False
        self._executor = executor
        self._loop = asyncio.get_running_loop()
        self._iterator = engine.stream(request, self.token)
        self._finished = False
        self._pending: asyncio.Future[AudioChunk | None] | None = None
        if start:
            self.start()

    def start(self) -> None:
        if self._pending is None and not self._closing:
            self._pending = self._loop.run_in_executor(self._executor, self._next_in_worker)

    def _next_in_worker(self) -> AudioChunk | None:
        chunk = next(self._iterator, None)
        if chunk is not None:
            self.generated += 1
        return chunk

    async def next(self) -> AudioChunk | None:
        """The next chunk, or None at the end. Engine exceptions surface as EngineFailure."""
        self.start()
        if self._finished or self._pending is None:
            return None
        try:
            chunk = await asyncio.shield(self._pending)
        except Exception as exc:  # an engine bug must not take the server down
            self._finished = True
            log.exception("engine stream failed")
            raise EngineFailure(f"{type(exc).__name__}: {exc}") from exc
        if chunk is None or self.token.cancelled:
            self._finished = True
            return None
        self._pending = self._loop.run_in_executor(self._executor, self._next_in_worker)
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
        self._loop.run_in_executor(self._executor, self._close_in_worker)

    def _close_in_worker(self) -> None:
        try:
            self._iterator.close()  # type: ignore[attr-defined]  # runs the engine's cleanup
        finally:
            if self._on_closed is not None:
                self._on_closed()


@dataclass
class StreamLimiter:
    """Counts open streams, globally and per client; used from the event loop only."""

    max_streams: int
    max_per_client: int
    _by_client: dict[str, int] = field(default_factory=dict)
    _total: int = 0

    def acquire(self, client: str) -> None:
        if self._total >= self.max_streams:
            raise Busy(f"the server is at its limit of {self.max_streams} concurrent streams; retry shortly")
        if self._by_client.get(client, 0) >= self.max_per_client:
            raise TooManyStreams(f"at most {self.max_per_client} concurrent streams per client")
        self._total += 1
        self._by_client[client] = self._by_client.get(client, 0) + 1

    def release(self, client: str) -> None:
        self._total -= 1
        left = self._by_client.get(client, 1) - 1
        if left:
            self._by_client[client] = left
        else:
            self._by_client.pop(client, None)

    @property
    def active(self) -> int:
        return self._total


@dataclass
class StreamOutcome:
    timing: Timing
    status: str = "completed"  # completed | client_disconnect | failed


class AudioStreamResponse(Response):
    """Streams `body` (already-encoded pieces) and reports how it ended via `on_finish`."""

    def __init__(
        self,
        body: AsyncIterator[bytes],
        timing: Timing,
        on_finish: Callable[[StreamOutcome], None],
        headers: dict[str, str],
        media_type: str,
    ) -> None:
        self.body_iterator = body
        self.timing = timing
        self.on_finish = on_finish
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = StreamOutcome(self.timing)
        self._all_sent = False
        try:
            async with anyio.create_task_group() as group:

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    if not self._all_sent:  # uvicorn also reports a disconnect after a complete response
                        outcome.status = "client_disconnect"
                        group.cancel_scope.cancel()

                group.start_soon(watch_disconnect)
                await self._send_all(send)
                group.cancel_scope.cancel()
        except Exception as exc:
            while isinstance(exc, ExceptionGroup):  # the task group wraps what the body raised
                exc = exc.exceptions[0]
            if isinstance(exc, OSError):  # the transport reported the disconnect first
                outcome.status = "client_disconnect"
                return
            outcome.status = "failed"
            self.timing.error_code = getattr(exc, "code", "internal_error")
            raise exc  # uvicorn drops the connection: the client sees a truncated body, not a clean end
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            self.timing.t_done = time.perf_counter()
            if self.timing.error_code is not None:
                outcome.status = "failed"
            self.on_finish(outcome)

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for piece in self.body_iterator:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if self.timing.t_first_audio_out is None:
                self.timing.t_first_audio_out = time.perf_counter()
            self.timing.chunks_sent += 1
        self._all_sent = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
