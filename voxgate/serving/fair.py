"""Fair admission to a shared backend (the LLM): who may send a request now, who waits, who
is told `busy`.

At most `max_active` requests run at once and at most `max_per_client` of them belong to one
client; the rest wait. A free slot goes to the waiting client served least recently (a
client never served, or idle since, first), so clients take turns: one client with fifty
queued requests delays another client's single request by about one request's time, not
fifty. A waiter gives up its place at once when its task is cancelled (the caller left) and
is told `busy` after `timeout_s`. The queue holds at most `max_waiting`; when it is full, a
client with fewer waiters than the longest queue's owner still gets in, in place of that
owner's newest waiter, so a flood is what gets refused, not the client beside it.

Asyncio only, no I/O, used from the event loop's thread (no lock); every wait is a future,
resolved by the release that frees its slot (no polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from voxgate.types import Busy


class Lease:
    """One slot, held until `release()`; releasing twice is harmless, so every exit path
    (the stream's end, an error, the client leaving) may call it."""

    __slots__ = ("_held", "_limiter", "client")

    def __init__(self, limiter: FairLimiter, client: str) -> None:
        self._limiter, self.client, self._held = limiter, client, True

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        if self._held:
            self._held = False
            self._limiter._release(self.client)


@dataclass(slots=True)
class _Waiter:
    ticket: int  # arrival order, for ties between clients never served
    future: asyncio.Future[Lease] = field(repr=False)


class FairLimiter:
    """`lease = await limiter.acquire(client)` ... `lease.release()`; or `async with limiter.slot(client)`."""

    def __init__(
        self, max_active: int, max_per_client: int, max_waiting: int, timeout_s: float, name: str = "LLM"
    ) -> None:
        if max_active < 1 or max_per_client < 1 or max_waiting < 0 or timeout_s <= 0:
            raise ValueError("FairLimiter needs max_active, max_per_client >= 1, max_waiting >= 0, timeout_s > 0")
        self.max_active, self.max_per_client, self.max_waiting = max_active, max_per_client, max_waiting
        self.timeout_s, self.name = timeout_s, name
        self._active: dict[str, int] = {}
        self._total = 0
        self._queues: dict[str, deque[_Waiter]] = {}  # clients with waiters
        self._waiting = 0
        self._last_served: dict[str, int] = {}  # turn of each client's latest slot, while it has work
        self._turns = itertools.count()
        self._tickets = itertools.count()

    @property
    def active(self) -> int:
        return self._total

    @property
    def waiting(self) -> int:
        return self._waiting

    def active_for(self, client: str) -> int:
        return self._active.get(client, 0)

    async def acquire(self, client: str) -> Lease:
        """A slot for `client`: at once if one is free to it, else after its turn in the queue.
        Raises `Busy` when the queue is full or the wait outlasts `timeout_s`."""
        if self._total < self.max_active and self.active_for(client) < self.max_per_client:
            return self._grant(client)  # nobody waits for this slot: waiters are only kept while none fits
        waiter = self._enqueue(client)
        timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire, client, waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(client, waiter)
            raise
        finally:
            timer.cancel()

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[Lease]:
        """Hold a slot for the `async with` block; released however the block ends."""
        lease = await self.acquire(client)
        try:
            yield lease
        finally:
            lease.release()

    # ------------------------------------------------------------------ inside

    def _grant(self, client: str) -> Lease:
        self._total += 1
        self._active[client] = self.active_for(client) + 1
        self._last_served[client] = next(self._turns)
        return Lease(self, client)

    def _release(self, client: str) -> None:
        self._total -= 1
        left = self.active_for(client) - 1
        if left > 0:
            self._active[client] = left
        else:
            self._active.pop(client, None)
            self._forget_if_idle(client)
        self._dispatch()

    def _enqueue(self, client: str) -> _Waiter:
        if self._waiting >= self.max_waiting:
            self._make_room(client)
        waiter = _Waiter(next(self._tickets), asyncio.get_running_loop().create_future())
        self._queues.setdefault(client, deque()).append(waiter)
        self._waiting += 1
        return waiter

    def _make_room(self, client: str) -> None:
        """The queue is full: refuse the newcomer, unless the longest queue holds at least two
        more than the newcomer's own; then that queue's newest waiter is refused instead."""
        mine = len(self._queues.get(client, ()))
        longest = max(self._queues, key=lambda c: len(self._queues[c]), default=None)
        if longest is None or len(self._queues[longest]) <= mine + 1:
            raise Busy(f"the {self.name} is busy: {self._waiting} requests are waiting; retry shortly")
        evicted = self._queues[longest].pop()
        self._forget_waiter(longest, evicted)
        if not evicted.future.done():
            evicted.future.set_exception(Busy(f"the {self.name} is busy: the queue is full; retry shortly"))

    def _dispatch(self) -> None:
        """Hand free slots to waiters: the eligible client served least recently first."""
        while self._total < self.max_active:
            client = self._next_client()
            if client is None:
                return
            waiter = self._queues[client].popleft()
            self._forget_waiter(client, waiter)
            if not waiter.future.done():  # a cancelled waiter whose task has not run yet
                waiter.future.set_result(self._grant(client))

    def _next_client(self) -> str | None:
        eligible = [c for c in self._queues if self.active_for(c) < self.max_per_client]
        if not eligible:
            return None
        return min(eligible, key=lambda c: (self._last_served.get(c, -1), self._queues[c][0].ticket))

    def _expire(self, client: str, waiter: _Waiter) -> None:
        if not waiter.future.done():
            self._remove(client, waiter)
            waiter.future.set_exception(
                Busy(f"waited {self.timeout_s:g} s for the {self.name} (it is busy); retry shortly")
            )

    def _abandon(self, client: str, waiter: _Waiter) -> None:
        """The waiting task was cancelled (its client left): leave the queue, or pass on a
        slot granted just before the cancellation arrived."""
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().release()
        else:
            self._remove(client, waiter)

    def _remove(self, client: str, waiter: _Waiter) -> None:
        queue = self._queues.get(client)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self._forget_waiter(client, waiter)

    def _forget_waiter(self, client: str, waiter: _Waiter) -> None:
        """Bookkeeping for a waiter just taken off its client's queue."""
        self._waiting -= 1
        if not self._queues.get(client):
            self._queues.pop(client, None)
            self._forget_if_idle(client)

    def _forget_if_idle(self, client: str) -> None:
        """A client with nothing running or waiting is forgotten (its next request counts as a
        newcomer's): the tables stay as small as the set of clients with work."""
        if client not in self._active and client not in self._queues:
            self._last_served.pop(client, None)
