"""Shared fixtures: real `voxgate serve` processes on free loopback ports."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import httpx
import pytest

# One compute thread per process, here and in every server a test starts (they inherit it): the
# suite must pass on a busy 2-core machine, where two torch threads per process spin against the
# other processes for the cores. Measured beside `stress-ng --cpu 2` and a second suite: ten
# syntheses of the tiny qwen3 model took 114 s with torch's default 2 threads (a run timed out
# at 300 s) and 26 s with 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch

if not torch.cuda.is_available():  # Triton kernels run in its interpreter (before any module defines them)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings

from voxgate.bench.server import ServerProcess

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Every property test draws the same examples on every run and has no per-example deadline: a result
# never depends on the random draw or on how busy the machine is. A test's own @settings still apply.
settings.register_profile("voxgate", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("voxgate")

LIMITS_KEYS = ("key-one", "key-two", "key-three")


@pytest.fixture(autouse=True)
def _no_voxgate_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's exported VOXGATE_* settings must not change what the tests see."""
    import os

    for name in [k for k in os.environ if k.startswith("VOXGATE_")]:
        monkeypatch.delenv(name)


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


def timing_row(server: ServerProcess, request_id: str, timeout: float = 30.0) -> dict:
    """The server-side timing of one stream (recorded just after it ends, so poll)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = httpx.get(f"{server.url}/debug/timings", headers=server.admin_headers()).json()["timings"]
        match = [r for r in rows if r["request_id"] == request_id]
        if match:
            return match[0]
        time.sleep(0.02)
    raise AssertionError(f"no timing recorded for {request_id}")


def wait_for(predicate, timeout: float = 30.0) -> bool:
    """Poll `predicate` until true or `timeout` (for state the server updates just after a response)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def tone_pcm(text: str, voice: str = "tone") -> bytes:
    """What the tone engine says for `text`, as the server's default pcm16 at 24 kHz."""
    from voxgate.audio import pcm16_bytes
    from voxgate.engines.base import collect
    from voxgate.engines.tone import ToneEngine
    from voxgate.types import SynthesisRequest

    return pcm16_bytes(collect(ToneEngine(), SynthesisRequest(text=text, voice=voice)).samples)
