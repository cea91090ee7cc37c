"""voxgate on a local Ray Serve for the tests: `voxgate serve --replicas 2` with the tone engine in
its own process group, and what the tests ask of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque

import httpx
import websockets

from tests.conftest import wait_for
from tests.integration.wsclient import Client

START_S = 240.0


class RayServer:
    """`voxgate serve --replicas 2` in its own process group (Ray's processes join it)."""

    def __init__(self, env: dict[str, str], args: tuple[str, ...] = (), ray_env: dict[str, str] | None = None) -> None:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(("VOXGATE_", "RAY_"))}
        env = {**inherited, **(ray_env or {}), "VOXGATE_ENGINE": "tone", "VOXGATE_LLM_EMBEDDED": "false",
               "VOXGATE_PORT": "0", **{f"VOXGATE_{k}": v for k, v in env.items()}}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "voxgate", "serve", "--replicas", "2", "--ray-cpus", "2", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.log: deque[str] = deque(maxlen=400)
        self.url = ""
        found = threading.Event()
        threading.Thread(target=self._pump, args=(found,), daemon=True).start()
        if not found.wait(START_S):
            self.stop()
            raise AssertionError("ray serve did not start:\n" + "\n".join(self.log))

    def _pump(self, found: threading.Event) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line.rstrip())
            match = re.search(r"serving on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                found.set()

    def ws(self, key: str | None) -> str:
        return self.url.replace("http://", "ws://") + "/v1/tts/ws" + (f"?session={key}" if key else "")

    def replica_of(self, key: str) -> dict:
        return httpx.get(f"{self.url}/cluster/replica", params={"session": key}, timeout=30).json()

    def readyz(self) -> dict:
        return httpx.get(f"{self.url}/cluster/readyz", timeout=30).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(90)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of Ray is left
        self.proc.wait()


def ready_replicas(server: RayServer) -> int:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return sum(r["ready"] for r in server.readyz()["replicas"].values())
    return 0


def keys_by_replica(server: RayServer, count: int = 30) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in range(count):
        key = f"key-{i}"
        out.setdefault(server.replica_of(key)["replica"], []).append(key)
    return out


def started(server: RayServer) -> RayServer:
    """`server` once both replicas are ready (stopped, with its log in the failure, if they are not)."""
    if not wait_for(lambda: ready_replicas(server) == 2, timeout=START_S):
        server.stop()
        raise AssertionError("\n".join(server.log))
    return server


def resume_on_its_replica(server: RayServer, key: str) -> None:
    """A session keyed `key` speaks, loses its socket, and resumes through the ingress on the
    replica that holds it: every unit is covered once across the two sockets."""

    async def run() -> None:
        first = await websockets.connect(server.ws(key))
        c = Client(first)
        began = await c.start(max_pending_units=2)
        assert began["session_id"] == key
        await c.words("a b c d e f")
        await c.until("units.done")
        first.transport.abort()  # a network drop
        last = c.of("units.done")[-1]["unit_end"]
        async with websockets.connect(server.ws(key)) as second:
            r = Client(second)
            resume = {"session_id": key, "resume_token": began["resume_token"], "last_unit_index_received": last}
            resumed = await r.start(resume=resume)
            assert resumed["type"] == "session.started" and resumed["resumed"]
            await r.send(type="session.end")
            await r.until("session.done")
        covered = {
            u for m in c.of("units.done") + r.of("units.done") for u in range(m["unit_start"], m["unit_end"] + 1)
        }
        assert covered == set(range(6))

    asyncio.run(run())


def sigterm_drains_every_session(server: RayServer) -> None:
    """Four sessions speaking when `voxgate serve --replicas` gets SIGTERM: each is told
    `server_draining` (fatal) before its socket closes, and the server exits."""

    async def run() -> None:
        sessions = []
        for key in ("drain-a", "drain-b", "drain-c", "drain-d"):
            c = Client(await websockets.connect(server.ws(key)))
            await c.start()
            await c.words("an utterance that never ends")
            await c.until("audio")
            sessions.append(c)
        server.proc.send_signal(signal.SIGTERM)
        for c in sessions:
            closing = await c.until("error", timeout=120)
            assert closing["code"] == "server_draining" and closing["fatal"]

    asyncio.run(run())
    assert wait_for(lambda: server.proc.poll() is not None, timeout=120)
