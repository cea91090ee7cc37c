"""How a long-running voxgate process runs: its event loop and its garbage collector.

Event loop: uvloop where installed (uvicorn picks it for the server by itself; `run` does
the same for our clients), asyncio's own otherwise. A load client on the faster loop adds
less of its own time to the latencies it measures.

Thread switching: a thread that wants the GIL waits until its holder drops it or is made to, after
the switch interval (Python's default: 5 ms). A server's event loop drops the GIL at every socket
wait and wants it back at once, while engine threads (one per stream, and the qwen3 runner) take
turns at it; each hand-back can cost the loop up to the interval. `voxgate serve` shortens it
(`VOXGATE_GIL_SWITCH_MS`, 0.2 ms): on an H100 with 64 streamed-text sessions on qwen3 the gateway's
added first-audio time fell in every same-machine pair measured (p95 by 4-30 %; BENCHMARKS.md,
issue 17), with no underruns added.

Garbage collector: CPython's full collection walks every tracked object. In a server that
has imported FastAPI, numpy, an engine and its voices that is ~100,000 objects and a 30-100
ms pause of the event loop, which lands on whatever is being served then (a burst of first
audio). The objects made at start-up live as long as the process, so once start-up is over
they are moved out of the collector's sight (`settle_heap`): later collections walk only
what serving made. Reference counting still frees everything acyclic at once; cycles made
while serving are still collected.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def loop_name() -> str:
    """The event loop `run` uses (and uvicorn's "auto" picks): uvloop or asyncio."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on uvloop where installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def settle_heap() -> int:
    """Collect once, then freeze what survived (start-up's objects); returns how many."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap settled: %d start-up objects frozen in %.0f ms", frozen, 1000 * (time.perf_counter() - started))
    return frozen


def set_switch_interval(ms: float) -> None:
    """How long a thread may hold the GIL while others wait (see the module)."""
    sys.setswitchinterval(ms / 1000)
