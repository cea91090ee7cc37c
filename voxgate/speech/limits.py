"""Stream admission, the same for every transport and keyed on the one client identity (an
API key, else the address: `voxgate.serving.auth.Client.id`): open streams, globally and per
client, taken at once or waited for in turn, bounded by what the engine can keep real-time;
and open sessions per client. Used from the event loop thread only, so they need no lock."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from voxgate.types import Busy, TooManySessions, TooManyStreams


@dataclass(eq=False, slots=True)
class _Waiter:
    client: str
    granted: asyncio.Future[None]


class StreamLimiter:
    """Admission of audio streams, and of the sessions that will ask for them.

    - A *standalone* stream (an HTTP request, a bridge reply) `acquire`s a slot now or hears
      `Busy` / `TooManyStreams` at once, and `release`s it.
    - A *session* (a WebSocket TTS session, an agent call) is let in by `open_session` (or
      hears `Busy`) and left by `close_session`; its streams (segments, replies) `wait` for
      slots in turn, so a session is never refused mid-utterance, and
      `release(client, in_session=True)`. A freed slot goes to the longest-waiting client
      under its own limit, so a client at its cap never blocks the others.

    Slots (streams computing at once) are `max_streams`. The engine's real-time capacity
    (`capacity()`: as it measures itself, `Engine.capacity`, whose figure for the batched qwen3
    engine follows its step cost while serving, or as the operator pinned it) bounds
    admission, not the slots: when it is known, the *voices* (open sessions plus standalone
    streams) may not pass it. A session reserves one voice for as long as it is open, since
    its listener expects real-time speech for all of it; a newcomer past the capacity hears
    `busy` at once rather than joining a round robin in which every listener would run dry.
    What is already in keeps going when the capacity falls (throttling it would only turn a
    slower engine into a queue for everyone). With no capacity known, a session is refused
    only when every slot is taken and others already wait."""

    __slots__ = ("_by_client", "_in_session", "_sessions", "_total", "_waiters", "capacity", "max_per_client",
                 "max_streams")  # fmt: skip

    def __init__(self, max_streams: int, max_per_client: int, capacity: Callable[[], int | None] | None = None) -> None:
        self.max_streams = max_streams
        self.max_per_client = max_per_client
        self.capacity = capacity
        self._by_client: dict[str, int] = {}
        self._total = 0  # streams holding slots
        self._in_session = 0  # of which sessions' streams
        self._sessions = 0  # sessions open
        self._waiters: deque[_Waiter] = deque()

    def _known(self) -> int | None:
        known = self.capacity() if self.capacity is not None else None
        return None if known is None else max(1, known)

    @property
    def limit(self) -> int:
        """Voices admitted at once now: `max_streams`, or the engine's real-time capacity if fewer."""
        known = self._known()
        return self.max_streams if known is None else min(self.max_streams, known)

    @property
    def voices(self) -> int:
        """What holds the engine's real-time voices: open sessions and standalone streams."""
        return self._sessions + self._total - self._in_session

    def acquire(self, client: str) -> None:
        """Take a slot for a standalone stream of `client`, or raise Busy / TooManyStreams."""
        if self._total >= self.max_streams:
            self._busy()
        self._check_voices()
        if self._by_client.get(client, 0) >= self.max_per_client:
            raise TooManyStreams(f"at most {self.max_per_client} concurrent streams per client")
        self._take(client)

    def open_session(self, *, force: bool = False) -> None:
        """Let a session in (it reserves a voice while the capacity is known), or raise Busy;
        `force`: without the checks (a listener that was in and comes back: a resume)."""
        if not force:
            self._check_voices()
            if self._waiters and self._total >= self.max_streams:
                self._busy()
        self._sessions += 1

    def close_session(self) -> None:
        self._sessions -= 1

    @property
    def sessions(self) -> int:
        return self._sessions

    def _check_voices(self) -> None:
        """With the capacity known, the voices stay within `limit` (what the gauge shows)."""
        known = self._known()
        if known is None or self.voices < min(known, self.max_streams):
            return
        if known < self.max_streams:
            raise Busy(f"the engine can voice {known} streams in real time and all are taken; retry shortly")
        self._busy()

    def _busy(self) -> None:
        raise Busy(f"the server is at its limit of {self.max_streams} concurrent streams; retry shortly")

    async def wait(self, client: str) -> None:
        """Take a slot for `client`, waiting in turn while the server or the client is full.
        Cancelling the wait leaves the queue (and gives back a slot granted meanwhile)."""
        if self._grantable(client):
            self._take(client, in_session=True)
            return
        waiter = _Waiter(client, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self.release(client, in_session=True)  # granted just as the wait was cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def release(self, client: str, *, in_session: bool = False) -> None:
        """Give back a slot: a standalone stream's, or (`in_session`) one a `wait` granted."""
        self._total -= 1
        self._in_session -= in_session
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

    def _take(self, client: str, in_session: bool = False) -> None:
        self._total += 1
        self._in_session += in_session
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
                self._take(waiter.client, in_session=True)
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
