"""Admission limits, all keyed on the one client identity (`voxgate.serving.auth.Client.id`):
open streams (globally and per client, taken at once or waited for in turn), open sessions
per client, and a message-rate bucket per socket. Used from the event loop thread only, so
they need no lock."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from voxgate.types import Busy, TooManySessions, TooManyStreams


@dataclass(eq=False, slots=True)
class _Waiter:
    client: str
    granted: asyncio.Future[None]


class StreamLimiter:
    """Counts open streams. `acquire` takes a slot now or refuses (HTTP answers at once);
    `wait` queues for one (a WebSocket session is not refused mid-utterance). A freed slot
    goes to the longest-waiting client that is under its own limit, so a client at its cap
    never blocks the others."""

    __slots__ = ("_by_client", "_total", "_waiters", "max_per_client", "max_streams")

    def __init__(self, max_streams: int, max_per_client: int) -> None:
        self.max_streams = max_streams
        self.max_per_client = max_per_client
        self._by_client: dict[str, int] = {}
        self._total = 0
        self._waiters: deque[_Waiter] = deque()

    def acquire(self, client: str) -> None:
        """Take a slot for `client`, or raise Busy / TooManyStreams."""
        if self._total >= self.max_streams:
            raise Busy(f"the server is at its limit of {self.max_streams} concurrent streams; retry shortly")
        if self._by_client.get(client, 0) >= self.max_per_client:
            raise TooManyStreams(f"at most {self.max_per_client} concurrent streams per client")
        self._take(client)

    async def wait(self, client: str) -> None:
        """Take a slot for `client`, waiting in turn while the server or the client is full.
        Cancelling the wait leaves the queue (and gives back a slot granted meanwhile)."""
        if self._grantable(client):
            self._take(client)
            return
        waiter = _Waiter(client, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(client)  # granted just as the wait was cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, client: str) -> None:
        self._total -= 1
        left = self._by_client.get(client, 1) - 1
        if left:
            self._by_client[client] = left
        else:
            self._by_client.pop(client, None)
        self._wake()

    @property
    def active(self) -> int:
        return self._total

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _grantable(self, client: str) -> bool:
        return self._total < self.max_streams and self._by_client.get(client, 0) < self.max_per_client

    def _take(self, client: str) -> None:
        self._total += 1
        self._by_client[client] = self._by_client.get(client, 0) + 1

    def _wake(self) -> None:
        """Grant free slots to waiters in arrival order, skipping clients at their own cap."""
        if not self._waiters or self._total >= self.max_streams:
            return
        for waiter in list(self._waiters):
            if self._total >= self.max_streams:
                return
            if self._grantable(waiter.client):
                self._waiters.remove(waiter)
                self._take(waiter.client)
                waiter.granted.set_result(None)


class SessionCounter:
    """Open sessions (WebSocket TTS sessions and bridge sockets) per client."""

    __slots__ = ("_by_client", "max_per_client")

    def __init__(self, max_per_client: int) -> None:
        self.max_per_client = max_per_client
        self._by_client: dict[str, int] = {}

    def open(self, client: str) -> None:
        """Count one more session for `client`, or raise TooManySessions."""
        held = self._by_client.get(client, 0)
        if held >= self.max_per_client:
            raise TooManySessions(f"at most {self.max_per_client} open sessions per client; end one first")
        self._by_client[client] = held + 1

    def close(self, client: str) -> None:
        left = self._by_client.get(client, 1) - 1
        if left:
            self._by_client[client] = left
        else:
            self._by_client.pop(client, None)

    def held(self, client: str) -> int:
        return self._by_client.get(client, 0)


class Turn:
    """Cooperative turns for a socket's reader. Frames a client has already sent are returned
    by `receive()` without suspending, so a flooding socket would run without letting anyone
    else in (without turns: +91 ms p99 on another session's first audio under a 4,000-space
    delta flood, +105 ms under a bridge config flood; with them, +44 and +24 ms). `await
    turn.end()` after each frame yields once `budget_s` has passed since the last yield: nobody
    waits more than about that long behind one socket, and a socket that is not flooding pays
    one clock read per frame (a yield after every frame would cost a loop pass each)."""

    __slots__ = ("_since", "budget_s")

    def __init__(self, budget_s: float = 0.002) -> None:
        self.budget_s = budget_s
        self._since = time.perf_counter()

    async def end(self) -> None:
        if time.perf_counter() - self._since >= self.budget_s:
            await asyncio.sleep(0)
            self._since = time.perf_counter()


@dataclass(slots=True)
class MessageRate:
    """A token bucket: `burst` messages at once, refilled at `per_s`; `take(now, size)` is False
    when the client is over its rate. A message costs one token per started `UNIT_BYTES` (a
    60 KB message costs 15): a flood of big messages is held to the same bytes as one of small
    ones would be at 4 KiB each. Times are the caller's clock (seconds)."""

    UNIT_BYTES: ClassVar[int] = 4096

    per_s: float
    burst: int
    _tokens: float = field(init=False)
    _at: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._tokens = float(self.burst)

    def take(self, now: float, size: int = 0) -> bool:
        if self._at is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
        self._at = now
        cost = min(max(1, -(-size // self.UNIT_BYTES)), self.burst)  # a full bucket takes any message
        if self._tokens < cost:
            return False
        self._tokens -= cost
        return True
