"""Streaming an engine's audio to an HTTP client (the engine side is `voxgate.speech.stream`).

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
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from voxgate.serving.transport import drop_connection
from voxgate.types import Timing

log = logging.getLogger(__name__)


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


def bounded(send: Send, timeout_s: float) -> Send:
    """`send` that raises TimeoutError when the client has not taken a message for `timeout_s`
    (a client that stopped reading would otherwise hold its stream, and its slot, for ever)."""

    async def send_within(message: Message) -> None:
        async with asyncio.timeout(timeout_s):
            await send(message)

    return send_within


def drop_slow_reader(scope: Scope, timeout_s: float) -> None:
    """Give up on a client that stopped reading: a warning, and its connection ended at once,
    its unread audio discarded (an expected end, not an error)."""
    log.warning("client stopped reading for %.0f s; dropping the stream", timeout_s)
    drop_connection(scope)


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
                drop_slow_reader(scope, self.send_timeout_s)
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

    async def _send_all(self, send: Send) -> None:
        """One body message a piece (a client reads `chunk_ms` pieces), with no pause between
        pieces that are ready together: the body waits only for the engine, so the pieces of a
        chunk (and of the next one, when the engine has made it already) go in one turn of the
        event loop. Under Ray Serve that turn is one message of Ray's streaming call from the
        replica to its proxy (Ray sends what the app queued while its loop was busy, and
        `cluster/deployment.py` runs the app on the replica's own loop), not one a piece: on
        2x H200 a burst of 64 streams sent ~1,600 a second, one per 40 ms piece, and got first
        audio 2.6x later than without Ray. A stop takes effect as before: the engine stops
        between chunks (`speech/stream.py`), and a send that waits for a slow socket lets the
        disconnect watch cancel the pieces after it."""
        timing, send = self.outcome.timing, bounded(send, self.send_timeout_s)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for piece in self.body_iterator:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if timing.t_first_audio_out is None and not self.watch.gone.is_set():
                timing.t_first_audio_out = time.perf_counter()
            timing.chunks_sent += 1
        self._complete = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
