"""How `voxgate serve` runs uvicorn: a bound on request heads and on WebSocket frames.

uvicorn's HTTP protocol waits forever for the head of a request (a client that sends half a
header line holds its connection, and a few thousand such hold the server's descriptors);
`HeadTimeoutProtocol` closes a connection whose request head has not fully arrived within
`header_timeout_s` of the connection opening or of the previous response ending. (The body
is bounded the same way by `RequestGate`.) WebSocket messages are limited to the gateway's
own message limit at the frame parser, so a 16 MiB frame is refused before it is buffered.
Each HTTP request's scope carries an ASGI extension with which a response that gives up on its
client (one that stopped reading) ends the connection at once: `drop_connection(scope)`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import uvicorn
from starlette.types import Scope
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from voxgate.config import Settings

WS_FRAME_SLACK = 1024  # the parser's limit sits just above the message limit, so the gateway says why


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request head."""

    head_timeout_s = 10.0  # set per server by `uvicorn_config`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def handle_events(self) -> None:
        scope, cycle = self.scope, self.cycle
        super().handle_events()
        if self.scope is not scope:  # a request head arrived (uvicorn made its scope)
            self._disarm()
        if self.cycle is not cycle and self.cycle is not None:  # its app runs from the next loop turn
            self.cycle.scope.setdefault("extensions", {})[_DROP] = functools.partial(_drop, self.cycle)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head must come in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


_DROP = "voxgate.drop_connection"


def _drop(cycle: RequestResponseCycle) -> None:
    cycle.disconnected = True  # else uvicorn logs "ASGI callable returned without completing response." at ERROR
    cycle.transport.abort()  # a close would wait behind the unread bytes


def drop_connection(scope: Scope) -> bool:
    """End the request's connection at once (the client sees its body cut short), as a client
    that left: deliberate, so not logged as an app's error. False where the server has no way
    to (not `voxgate serve`'s protocol: the response then ends without its last chunk)."""
    drop = scope.get("extensions", {}).get(_DROP)
    if drop is None:
        return False
    drop()
    return True


def uvicorn_config(app: Any, settings: Settings, access_log: bool) -> uvicorn.Config:
    """The uvicorn configuration `voxgate serve` runs with."""
    protocol = type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), {"head_timeout_s": settings.header_timeout_s})
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=access_log,
        timeout_graceful_shutdown=2,  # after the drain (serving/lifecycle.py), which waited VOXGATE_DRAIN_S
        http=protocol,
        ws_max_size=settings.ws_max_message_bytes + WS_FRAME_SLACK,
    )


_CLIENT_FAULTS = ("Invalid UTF-8 sequence received from client.",)  # uvicorn logs these with a traceback


class _ClientFaultFilter(logging.Filter):
    """A client's malformed frame is the client's fault: one warning line, no traceback (else
    any client could fill the log with tracebacks, one per connection)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() in _CLIENT_FAULTS:
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_client_faults() -> None:
    """Install the filter on uvicorn's error logger (idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ClientFaultFilter) for f in logger.filters):
        logger.addFilter(_ClientFaultFilter())
