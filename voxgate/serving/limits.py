"""Open-stream accounting, globally and per client."""

from __future__ import annotations

from voxgate.types import Busy, TooManyStreams


class StreamLimiter:
    """Counts open streams; used from the event loop thread only, so it needs no lock."""

    __slots__ = ("_by_client", "_total", "max_per_client", "max_streams")

    def __init__(self, max_streams: int, max_per_client: int) -> None:
        self.max_streams = max_streams
        self.max_per_client = max_per_client
        self._by_client: dict[str, int] = {}
        self._total = 0

    def acquire(self, client: str) -> None:
        """Take a slot for `client`, or raise Busy / TooManyStreams."""
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
