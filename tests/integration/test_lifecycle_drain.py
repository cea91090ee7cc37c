"""Liveness, readiness, the drain on SIGTERM and client-chosen session ids, on a real server
(tone engine) over loopback. Every wait is on an event (a message, a status), with generous
timeouts: nothing here depends on how fast a busy machine is."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator

import httpx
import pytest
import websockets

from tests.conftest import wait_for
from tests.integration.wsclient import Client
from voxgate.bench.server import ServerProcess


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    env = {"TONE_DELAY_MS": "2", "ENGINE_CAPACITY": "2", "WS_RESUME_WINDOW_S": "30"}
    with ServerProcess("tone", env=env) as running:
        yield running


def _ws(server: ServerProcess, query: str = "") -> str:
    return server.url.replace("http://", "ws://") + "/v1/tts/ws" + (f"?{query}" if query else "")


def test_livez_answers_while_the_engine_loads_and_readyz_waits_for_it():
    with ServerProcess("piper", wait_ready=False) as starting:
        assert httpx.get(f"{starting.url}/livez").json() == {"status": "alive"}
        early = httpx.get(f"{starting.url}/readyz")
        assert early.status_code == 503 and early.json()["reason"] == "starting" and not early.json()["warm"]
        assert wait_for(lambda: httpx.get(f"{starting.url}/readyz").status_code == 200, timeout=120)


def test_readyz_reports_free_voices_and_turns_503_when_full(server):
    ready = httpx.get(f"{server.url}/readyz").json()
    assert ready["ready"] and ready["warm"] and not ready["draining"] and ready["free_slots"] == 2

    async def run() -> None:
        async with websockets.connect(_ws(server)) as one, websockets.connect(_ws(server)) as two:
            for ws in (one, two):
                assert (await Client(ws).start())["type"] == "session.started"
            full = httpx.get(f"{server.url}/readyz")
            assert full.status_code == 503 and full.json()["reason"] == "full" and full.json()["free_slots"] == 0
            assert httpx.get(f"{server.url}/livez").status_code == 200  # full is not dead
            assert httpx.get(f"{server.url}/healthz").status_code == 200  # /healthz as it was

    asyncio.run(run())
    assert wait_for(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, timeout=30)


def test_a_client_chosen_session_id_is_used_and_a_taken_one_refused(server):
    async def run() -> None:
        async with websockets.connect(_ws(server, "session=call-42.a_b~c")) as ws:
            c = Client(ws)
            started = await c.start()
            assert started["session_id"] == "call-42.a_b~c"
            token = started["resume_token"]
            await c.words("one two")
            await c.send(type="text.end")
            await c.until("utterance.done")
            async with websockets.connect(_ws(server)) as other:
                o = Client(other)
                taken = await o.start(session_id="call-42.a_b~c")  # someone else's id: never joined
                assert taken["code"] == "session_id_taken" and not taken["fatal"]
                header = await websockets.connect(
                    _ws(server), additional_headers={"X-Voxgate-Session": "call-42.a_b~c"}
                )
                async with header:
                    assert (await Client(header).start())["code"] == "session_id_taken"
                mine = await o.start(session_id="call-43")
                assert mine["type"] == "session.started" and mine["session_id"] == "call-43"
        # the socket dropped: a resume with the id as the connect's key (what a router hashes) and the token
        async with websockets.connect(_ws(server, "session=call-42.a_b~c")) as again:
            r = Client(again)
            resume = {"session_id": "call-42.a_b~c", "resume_token": token, "last_unit_index_received": 1}
            resumed = await r.start(resume=resume)
            assert resumed["type"] == "session.started" and resumed["resumed"]
            await r.send(type="session.end")
            await r.until("session.done")

    asyncio.run(run())


@pytest.mark.parametrize(
    ("query", "headers"),
    [
        ("session=" + "x" * 65, {}),
        ("session=bad%20id", {}),
        ("session=%00", {}),
        ("session=", {}),
        ("session=a", {"X-Voxgate-Session": "b"}),
        ("", {"X-Voxgate-Session": "no/slash"}),
    ],
)
def test_a_bad_session_key_on_connect_is_a_typed_fatal_error(server, query, headers):
    async def run() -> None:
        async with websockets.connect(_ws(server, query), additional_headers=headers) as ws:
            refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert refused["code"] == "invalid_session_id" and refused["fatal"]
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 30)

    asyncio.run(run())


def test_a_flood_of_bad_and_taken_ids_gets_typed_errors_and_the_server_stays_ready(server):
    async def run() -> None:
        async with websockets.connect(_ws(server, "session=holder")) as holder:
            assert (await Client(holder).start())["session_id"] == "holder"
            async with websockets.connect(_ws(server)) as ws:
                c = Client(ws)
                codes = set()
                for i in range(40):
                    wanted = "holder" if i % 2 else f"bad id {i}"
                    reply = await c.start(session_id=wanted)
                    codes.add(reply["code"])
                    if reply["code"] == "rate_limited":
                        break
                assert codes <= {"session_id_taken", "invalid_message", "invalid_session_id", "rate_limited"}
                assert "session_id_taken" in codes and "invalid_session_id" in codes

    asyncio.run(run())
    assert httpx.get(f"{server.url}/readyz").json()["warm"]
    assert wait_for(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, timeout=30)


def test_sigterm_drains_running_utterances_refuses_new_work_then_closes_with_server_draining():
    with ServerProcess("tone", env={"DRAIN_S": "60", "TONE_DELAY_MS": "2"}) as draining:

        async def run() -> None:
            async with websockets.connect(_ws(draining)) as ws:
                a = Client(ws)
                await a.start()
                await a.words("a running utterance")
                await a.until("audio")
                os.kill(draining.pid, signal.SIGTERM)  # while the utterance is open
                assert wait_for(lambda: httpx.get(f"{draining.url}/readyz").json()["draining"], timeout=30)
                assert httpx.get(f"{draining.url}/readyz").status_code == 503
                assert httpx.get(f"{draining.url}/livez").status_code == 200
                late = httpx.post(f"{draining.url}/tts/stream", json={"text": "too late"})
                assert late.status_code == 503 and late.json()["error"]["code"] == "server_draining"
                async with websockets.connect(_ws(draining)) as newcomer:
                    refused = await Client(newcomer).start()
                    assert refused["code"] == "server_draining" and refused["fatal"]
                await a.words("still spoken to the end")  # the running session goes on
                await a.send(type="text.end")
                done = await a.until("utterance.done")
                assert done["status"] == "completed"
                spoken = {u for m in a.of("units.done") for u in range(m["unit_start"], m["unit_end"] + 1)}
                assert spoken == set(range(8))
                closing = await a.until("error")
                assert closing["code"] == "server_draining" and closing["fatal"]
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), 30)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012

        asyncio.run(run())
        assert wait_for(lambda: draining.returncode is not None, timeout=30)
        assert draining.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
        assert not any("Traceback" in line for line in draining.log)


def test_the_drain_time_bounds_the_wait_for_an_utterance_that_never_ends():
    with ServerProcess("tone", env={"DRAIN_S": "1", "TONE_DELAY_MS": "2"}) as draining:

        async def run() -> None:
            async with websockets.connect(_ws(draining)) as ws:
                a = Client(ws)
                await a.start()
                await a.words("never ended")
                await a.until("audio")
                os.kill(draining.pid, signal.SIGTERM)
                closing = await a.until("error", timeout=60)
                assert closing["code"] == "server_draining" and closing["fatal"]

        asyncio.run(run())
        assert wait_for(lambda: draining.returncode is not None, timeout=60)
