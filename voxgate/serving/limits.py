"""Per-socket limits: cooperative turns for a socket's reader and a message-rate bucket.
Used from the event loop thread only, so they need no lock. (Stream and session admission,
shared by every transport, is `voxgate.speech.limits`.)"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import ClassVar


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
