"""Shared fixtures: real `voxgate serve` processes on free loopback ports."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from voxgate.bench.server import ServerProcess

LIMITS_KEYS = ("key-one", "key-two", "key-three")


@pytest.fixture(scope="session")
def tone_server() -> Iterator[ServerProcess]:
    """Instant tone engine; generous per-client limit for the concurrency test."""
    with ServerProcess("tone", env={"MAX_STREAMS_PER_CLIENT": "32", "MAX_REQUEST_BYTES": "4096",
                                    "MAX_TEXT_CHARS": "500"}) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="session")
def slow_server() -> Iterator[ServerProcess]:
    """Tone at 40 ms per chunk behind API keys, with tight stream limits."""
    env = {"TONE_DELAY_MS": "40", "API_KEYS": ",".join(LIMITS_KEYS), "MAX_STREAMS": "3", "MAX_STREAMS_PER_CLIENT": "2"}
    with ServerProcess("tone", env=env) as server:
        yield server


@pytest.fixture(scope="session")
def piper_server() -> Iterator[ServerProcess]:
    with ServerProcess("piper") as server:
        yield server


def metric(server: ServerProcess, name: str, headers: dict[str, str] | None = None) -> float:
    """Sum of a Prometheus sample family (`name` may include a label selector)."""
    text = httpx.get(f"{server.url}/metrics", headers=headers or server.auth_headers()).text
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", re.M)
    if "{" in name:
        pattern = re.compile(rf"^{re.escape(name)} ([0-9.e+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))
