"""Admission bounded by the engine's real-time capacity, the same on every transport: past the
slots, HTTP hears `busy` (503 + Retry-After) at once, a new WebSocket session or agent call
hears `busy` while others already wait, and sessions already open wait their turn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest
import websockets

from tests.conftest import ServerProcess, metric, wait_for
from tests.integration.test_agent_abuse import OFFER
from tests.integration.wsclient import Client

LONG_TEXT = " ".join(f"word{i}" for i in range(200))  # 200 chunks at 40 ms each: 8 s of generation
CAPACITY = 2


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """The engine says it keeps 2 streams real-time; the configured limits are far above."""
    env = {"TONE_DELAY_MS": "40", "ENGINE_CAPACITY": str(CAPACITY), "MAX_STREAMS": "8", "MAX_STREAMS_PER_CLIENT": "8"}
    with ServerProcess("tone", env=env) as server:
        yield server


def _hold(stack: ExitStack, server: ServerProcess) -> httpx.Response:
    """A long stream whose response stays open (its slot held) until the stack closes."""
    url = f"{server.url}/tts/stream"
    response = stack.enter_context(httpx.stream("POST", url, json={"text": LONG_TEXT}, timeout=30))
    assert response.status_code == 200
    return response


def test_http_past_the_capacity_hears_busy_with_retry_after_and_the_gauges_agree(server):
    url = f"{server.url}/tts/stream"
    assert httpx.get(f"{server.url}/healthz").json()["stream_slots"] == CAPACITY
    assert metric(server, "voxgate_stream_slots") == CAPACITY
    with ExitStack() as stack:
        for _ in range(CAPACITY):
            _hold(stack, server)
        busy = httpx.post(url, json={"text": "one too many"})
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["code"] == "busy" and "real time" in busy.json()["error"]["message"]
        assert busy.headers["retry-after"] == "1"
        openai = httpx.post(f"{server.url}/v1/audio/speech", json={"model": "tts-1", "input": "hi", "voice": "alloy"})
        assert openai.status_code == 503 and openai.headers["retry-after"] == "1"
        assert httpx.get(f"{server.url}/healthz").json()["active_streams"] == CAPACITY
        assert metric(server, "voxgate_active_streams") == CAPACITY
    assert wait_for(lambda: metric(server, "voxgate_active_streams") == 0)
    assert httpx.post(url, json={"text": "room again"}).status_code == 200


def test_a_session_reserves_a_voice_and_a_newcomer_past_the_capacity_hears_busy(server):
    ws_url = server.url.replace("http", "ws") + "/v1/tts/ws"

    async def run() -> None:
        with ExitStack() as stack:
            _hold(stack, server)  # one standalone stream: one voice of the two
            async with websockets.connect(ws_url) as first_ws, websockets.connect(ws_url) as second_ws:
                first, second = Client(first_ws), Client(second_ws)
                assert (await first.start())["type"] == "session.started"  # the second voice
                refused = await second.start()
                assert refused["type"] == "error" and refused["code"] == "busy", refused
                http = await asyncio.to_thread(httpx.post, f"{server.url}/tts/stream", json={"text": "no voice left"})
                assert http.status_code == 503 and http.headers["retry-after"] == "1"
                offer = await asyncio.to_thread(
                    httpx.post, f"{server.url}/v1/agent/offer", json={"sdp": OFFER, "type": "offer"}
                )
                assert offer.status_code == 503 and offer.json()["error"]["code"] == "busy", offer.text
                await first.words("the reserved voice speaks")  # while the standalone stream still runs
                await first.send(type="text.end")
                assert (await first.until("audio"))["type"] == "audio"
                await first.until("utterance.done")
                await first.send(type="session.end")
                await first.until("session.done")
                assert await asyncio.to_thread(wait_for, lambda: metric(server, "voxgate_ws_sessions") == 0)
                retried = await second.start()  # the socket stayed open; a voice is free now
                assert retried["type"] == "session.started", retried
                await second.send(type="session.end")  # ended, not dropped: nothing waits for a resume
                await second.until("session.done")

    asyncio.run(run())
    assert wait_for(lambda: metric(server, "voxgate_active_streams") == 0)


def test_a_dropped_session_frees_its_voice_and_its_resume_takes_one_back(server):
    """Nobody listens to a session whose socket dropped: a newcomer may have its voice at once
    (the load after an overload must not wait out the resume window), and the listener who
    comes back resumes even when that puts the voices past the capacity."""
    ws_url = server.url.replace("http", "ws") + "/v1/tts/ws"

    # No session of an earlier test may be left (a dropped one would wait out its resume window).
    assert wait_for(lambda: metric(server, "voxgate_ws_sessions") == 0, timeout=60)

    async def run() -> None:
        async with websockets.connect(ws_url) as b_ws, websockets.connect(ws_url) as c_ws:
            a_ws = await websockets.connect(ws_url)
            started = await Client(a_ws).start()
            assert started["type"] == "session.started"
            b, c = Client(b_ws), Client(c_ws)
            assert (await b.start())["type"] == "session.started"
            assert (await c.start())["code"] == "busy"
            await a_ws.close()  # dropped, not ended: the session waits for a resume
            assert await asyncio.to_thread(wait_for, lambda: metric(server, "voxgate_ws_sessions_detached") == 1)
            assert (await c.start())["type"] == "session.started"  # the dropped session's voice
            async with websockets.connect(ws_url) as again_ws:
                again = Client(again_ws)
                resume = {"session_id": started["session_id"], "resume_token": started["resume_token"],
                          "last_unit_index_received": -1}  # fmt: skip
                await again.send(type="session.start", resume=resume)
                resumed = await again.next()
                assert resumed["type"] == "session.started" and resumed["resumed"] is True, resumed
                await again.send(type="session.end")
                await again.until("session.done")
            await b.send(type="session.end")
            await c.send(type="session.end")
            await b.until("session.done")
            await c.until("session.done")
        assert await asyncio.to_thread(wait_for, lambda: metric(server, "voxgate_ws_sessions") == 0)
        async with websockets.connect(ws_url) as d_ws, websockets.connect(ws_url) as e_ws:
            assert (await Client(d_ws).start())["type"] == "session.started"  # every voice came back
            assert (await Client(e_ws).start())["type"] == "session.started"

    asyncio.run(run())


@pytest.fixture(scope="module")
def small_replay_server() -> Iterator[ServerProcess]:
    """Tone at 2 ms a unit (120 ms of audio), a 64 KiB replay budget (about 11 units)."""
    env = {"TONE_DELAY_MS": "2", "WS_REPLAY_BYTES": "65536", "WS_RESUME_WINDOW_S": "120"}
    with ServerProcess("tone", env=env) as server:
        yield server


UNIT_BYTES = 5760  # 120 ms of pcm16 at 24 kHz


def test_a_session_nobody_listens_to_is_voiced_no_further_than_its_replay_budget(small_replay_server):
    """Its text waits, not voiced ahead of the sessions that do listen; nothing of it is lost:
    a resume gets every unit."""
    server = small_replay_server
    ws_url = server.url.replace("http", "ws") + "/v1/tts/ws"
    words = 300  # 36 s of audio, 1.7 MB: far past the budget and the 1 MiB send queue

    def voiced(session_id: str) -> float:
        """Audio seconds of the session's segments that have finished (from their timing rows)."""
        rows = httpx.get(f"{server.url}/debug/timings", headers=server.admin_headers()).json()["timings"]
        ours = [r for r in rows if r["request_id"].startswith(session_id + ":")]
        # segment rows; a segment's first-audio row (only if the socket was still there to write to) has none
        return round(sum(r["audio_s"] for r in ours if r["status"] != "first_audio"), 3)

    async def run() -> None:
        ws = await websockets.connect(ws_url)
        client = Client(ws)
        started = await client.start()
        await client.words(" ".join(f"w{i}" for i in range(words)))
        await client.send(type="text.end")
        await ws.close()  # dropped without reading
        session_id = started["session_id"]
        previous = -1.0
        while (now := voiced(session_id)) != previous:  # settled: nothing finished for a second
            previous = now
            await asyncio.sleep(1.0)
        # the budget (1.37 s), the segment that crossed it and the one under way (12 units, 1.44 s
        # each), the 3-unit starter: 4.6 s at most of the 36 s
        assert now <= 5.0, f"{now} s of {words * 0.12:.0f} s voiced with nobody listening"
        async with websockets.connect(ws_url) as again_ws:
            again = Client(again_ws)
            resume = {"session_id": session_id, "resume_token": started["resume_token"],
                      "last_unit_index_received": -1}  # fmt: skip
            await again.send(type="session.start", resume=resume)
            assert (await again.next())["type"] == "session.started"
            await again.until("utterance.done", timeout=60)
            audio = sum(len(m["payload"]) for m in again.of("audio") if "payload" in m)
            assert audio == words * UNIT_BYTES  # every unit, once

    asyncio.run(run())
