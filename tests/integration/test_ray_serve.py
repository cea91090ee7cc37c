"""voxgate on a local Ray Serve: `voxgate serve --replicas 2` with the tone engine, started once
for the module (Ray takes tens of seconds to start on two cores). Session keys reach one
replica, a resume goes through Ray's proxy to the session's replica, readiness and metrics add
up across replicas, killing one replica leaves the other's sessions alone, and SIGTERM drains.
Waits are on events and states, with generous timeouts."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import websockets

from tests.conftest import wait_for
from tests.integration.raycluster import (
    RayServer,
    keys_by_replica,
    ready_replicas,
    resume_on_its_replica,
    sigterm_drains_every_session,
    started,
)
from tests.integration.wsclient import Client

pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayServer]:
    server = started(RayServer({"TONE_DELAY_MS": "5", "DRAIN_S": "3"}, ("--ingress", "proxy")))
    try:
        yield server
    finally:
        server.stop()


def test_a_session_key_always_reaches_the_same_replica_and_keys_spread_over_both(cluster):
    keys = keys_by_replica(cluster)
    assert len(keys) == 2  # 30 keys on one replica of two: p = 2**-29
    for replica, some in keys.items():
        for key in some[:5]:
            by_header = httpx.get(f"{cluster.url}/cluster/replica", headers={"X-Voxgate-Session": key}).json()
            assert by_header["replica"] == replica == cluster.replica_of(key)["replica"]


def test_a_session_resumes_through_ray_on_its_replica(cluster):
    resume_on_its_replica(cluster, "resume-me")


def test_sessions_without_a_key_go_to_the_less_loaded_replica(cluster):
    """No key, no replica to come back to: the router takes the replica with fewer requests open,
    not a hash of the request id (which can pile a burst onto one replica: on 2 GPUs, 128 HTTP
    streams over two 64-row replicas got `busy`). Eight sessions held open land 4 and 4 (at
    worst 5 and 3 if Ray's queue-length cache lags); a hash would give 6-2 or worse 29 % of
    the time."""

    async def run() -> None:
        sockets = []
        try:
            for _ in range(8):
                ws = await websockets.connect(cluster.ws(None))
                sockets.append(ws)
                await Client(ws).start()
            assert wait_for(lambda: sum(r["sessions"] for r in cluster.readyz()["replicas"].values()) >= 8, 30)
            counts = sorted(r["sessions"] for r in cluster.readyz()["replicas"].values())
            assert len(counts) == 2 and counts[0] >= 3, counts
        finally:
            for ws in sockets:
                await ws.close()

    asyncio.run(run())


def test_readiness_and_metrics_add_up_across_replicas(cluster):
    keys = keys_by_replica(cluster)
    for some in keys.values():
        for key in some[:3]:
            reply = httpx.post(
                f"{cluster.url}/tts/stream", json={"text": "counted"}, headers={"X-Voxgate-Session": key}
            )
            assert reply.status_code == 200
    ready = cluster.readyz()
    assert ready["ready"] and ready["live_replicas"] == 2
    assert ready["free_slots"] == sum(r["free_slots"] for r in ready["replicas"].values())

    def summed() -> float:
        text = httpx.get(f"{cluster.url}/cluster/metrics").text
        assert "voxgate_cluster_replicas 2" in text
        found = re.search(r'^voxgate_requests_total\{endpoint="/tts/stream",status="200"\} (\S+)$', text, re.M)
        return float(found.group(1)) if found else 0.0

    assert wait_for(lambda: summed() >= 6, timeout=30)  # three on each replica, each counted once a second


def test_killing_one_replica_ends_only_its_sessions_and_theirs_cannot_resume(cluster):
    keys = keys_by_replica(cluster)
    (_, doomed_keys), (kept, kept_keys) = list(keys.items())
    pid = cluster.replica_of(doomed_keys[0])["pid"]

    async def speak(key: str, heard: asyncio.Event, killed: asyncio.Event) -> tuple[list[dict], dict | None]:
        async with websockets.connect(cluster.ws(key)) as ws:
            c = Client(ws)
            started = await c.start()
            await c.words("one two three four")
            await c.until("audio")
            heard.set()
            await killed.wait()
            try:
                await c.words("five six seven eight")
                await c.send(type="text.end")
                await c.until("utterance.done", timeout=60)
                return c.messages, None
            except (websockets.ConnectionClosed, TimeoutError):
                return c.messages, started

    async def resume(key: str, started: dict) -> dict:
        deadline = time.monotonic() + 120
        while True:  # until Ray's router has seen the replica go: a connect may fail meanwhile
            try:
                async with websockets.connect(cluster.ws(key)) as ws:
                    r = Client(ws)
                    token = {"session_id": key, "resume_token": started["resume_token"], "last_unit_index_received": 3}
                    return await r.start(resume=token)
            except (OSError, websockets.WebSocketException, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)

    async def run() -> None:
        killed = asyncio.Event()
        heard = [asyncio.Event() for _ in range(4)]
        chosen = (*doomed_keys[:2], *kept_keys[:2])
        tasks = [asyncio.ensure_future(speak(k, h, killed)) for k, h in zip(chosen, heard, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(h.wait() for h in heard)), timeout=120)  # all four speaking
        os.kill(pid, signal.SIGKILL)
        killed.set()
        results = await asyncio.gather(*tasks)
        for messages, lost in results[2:]:  # the other replica's sessions: on to the end, no error
            assert lost is None and not [m for m in messages if m["type"] == "error"]
        for (_, lost), key in zip(results[:2], doomed_keys, strict=False):
            assert lost is not None  # the socket went with its replica
            refused = await resume(key, lost)
            assert refused["code"] == "resume_not_available" and not refused["fatal"]

    asyncio.run(run())
    assert kept in cluster.readyz()["replicas"]
    assert wait_for(lambda: ready_replicas(cluster) == 2, timeout=180)  # Ray replaced the dead one


def test_sigterm_drains_every_replica_and_tells_each_session(cluster):
    sigterm_drains_every_session(cluster)
