"""Real WebRTC calls on loopback: the voxgate app (tone engine, the agent signalling router)
served by uvicorn in-process, and an `AgentBot`, both real aiortc peers on one event loop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aioice.ice
import httpx
import numpy as np
import pytest
import uvicorn
from aiortc import RTCPeerConnection

from voxgate.agent.bot import AgentBot, BotError, add_arguments, run_agent_bot
from voxgate.agent.frames import FRAME_S
from voxgate.agent.webrtc import PeerSession
from voxgate.audio import decode_wav, wav_bytes
from voxgate.config import Settings
from voxgate.engines.tone import create as create_tone
from voxgate.serving.agent_http import AgentCalls, router
from voxgate.serving.app import create_app

SILENT_RMS = 0.01


@pytest.fixture(autouse=True)
def _host_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """aioice never offers 127.0.0.1; on a machine with no other address (a bare container)
    the peers would have no candidate at all, so let them use loopback there."""
    if not aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=False):
        monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])


def tone(seconds: float, rate: int, freq: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


class Agent:
    """A test agent (the `agent_factory`): keeps the session, the mic audio it hears, the
    frames it publishes and the events it gets."""

    def __init__(self) -> None:
        self.session: PeerSession | None = None
        self.call_id = ""
        self.mic: list[tuple[np.ndarray, float]] = []
        self.published: list[tuple[Any, float, float]] = []
        self.drained: list[tuple[Any, float]] = []
        self.messages: list[dict[str, Any]] = []
        self.joined = asyncio.Event()

    def __call__(self, session: PeerSession, call_id: str, client: str = "") -> Awaitable[None]:
        self.session, self.call_id = session, call_id
        session.outbound.on_published = lambda *a: self.published.append(a)
        session.outbound.on_drained = lambda *a: self.drained.append(a)
        session.on_message(self.messages.append)
        session.send_event({"type": "hello", "call_id": call_id})  # before the channel is open: held
        self.joined.set()
        return self._listen(session)

    async def _listen(self, session: PeerSession) -> None:
        assert session.inbound is not None
        async for pcm, t in session.inbound:
            self.mic.append((pcm, t))
        await session.closed.wait()


@contextlib.asynccontextmanager
async def agent_server(agent: Callable[..., Any] | None = None, max_calls: int = 4) -> AsyncIterator[Any]:
    settings = Settings(engine="tone", warmup=False, starter_cache=False, llm_embedded=False, agent_max_calls=0)
    app = create_app(settings, engine=create_tone(settings))
    app.include_router(router)
    app.state.agent_calls = AgentCalls(max_calls)
    if agent is not None:
        app.state.agent_factory = agent
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "uvicorn did not start"
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    app.state.url = f"http://127.0.0.1:{port}"
    try:
        yield app
    finally:
        await app.state.agent_calls.close_all()
        server.should_exit = True
        await task


def run(coro: Awaitable[None], timeout_s: float = 120.0) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(timeout_s):
            await coro

    asyncio.run(bounded())


def test_audio_flows_both_ways_at_pitch_and_in_real_time(record_property: Any) -> None:
    async def call() -> None:
        agent = Agent()
        async with agent_server(agent) as app:
            bot = AgentBot()
            await bot.connect(app.state.url)
            await agent.joined.wait()
            outbound = agent.session.outbound
            outbound.enqueue(tone(1.0, 24000, 1000.0), 24000, "reply")  # an engine-rate reply
            outbound.end("reply")
            await bot.say(tone(1.0, 48000, 600.0), 48000)
            assert await bot.wait_for(lambda: len(agent.drained) == 1 and len(bot.audio) > 60, 30.0)
            await asyncio.sleep(0.2)  # the jitter buffers' tail
            await bot.hang_up()

        # The bot's 600 Hz arrives at the agent as 16 kHz int16 at the level it was sent.
        heard = np.concatenate([pcm for pcm, _ in agent.mic]).astype(np.float32) / 32767
        assert agent.session.inbound.sample_rate == 16000 and agent.mic[0][0].dtype == np.int16
        loud = heard[np.abs(heard) > 0.05]
        assert len(loud) > 0.9 * 16000
        assert peak_hz(heard, 16000) == pytest.approx(600.0, abs=3.0)
        assert rms(heard[np.flatnonzero(np.abs(heard) > 0.05)[0] :][: 16000 // 2]) == pytest.approx(0.354, rel=0.15)

        # The agent's 1 kHz arrives at the bot.
        got = bot.received_audio()
        assert peak_hz(got, 16000) == pytest.approx(1000.0, abs=3.0)
        assert rms(got) > 0.1

        # Pacing: 1 s of audio published over ~1 s, on the track's 20 ms grid (a frame the loop
        # held up is late, and the next ones catch up with the grid, never run ahead of it).
        times = np.array([t for _, _, t in agent.published])
        assert len(times) == 50 and sum(s for _, s, _ in agent.published) == pytest.approx(1.0, abs=1e-3)
        offsets = (times - times[0]) - FRAME_S * np.arange(len(times))
        late = offsets - offsets.min()
        # The lower bound is the property (never ahead of the grid; an unpaced track takes a few ms).
        # The upper bounds only say "not stuck": a loop starved by a busy machine delays frames, so
        # the typical lateness (a few ms, printed below) is measured, not asserted.
        assert 0.9 <= times[-1] - times[0] <= 3.0
        assert late.max() < 1.0
        assert len(agent.drained) == 1 and agent.drained[0][0] == "reply" and agent.drained[0][1] >= times[-1]
        record_property("pacing_late_ms", [round(1000 * float(x), 2) for x in (np.median(late), late.max())])
        print(f"pacing: span {1000 * (times[-1] - times[0]):.1f} ms for 49 intervals (980 ideal); late vs the grid: "
              f"median {1000 * np.median(late):.2f} ms, p95 {1000 * np.percentile(late, 95):.2f}, "
              f"max {1000 * late.max():.2f}")  # fmt: skip

    run(call())


def test_flush_silences_the_bot_within_a_frame_plus_network(record_property: Any) -> None:
    in_flight: list[float] = []  # flush - the last frame published before it: what still plays

    async def call() -> list[float]:
        agent = Agent()
        delays = []
        async with agent_server(agent) as app:
            bot = AgentBot()
            await bot.connect(app.state.url)
            await agent.joined.wait()
            outbound = agent.session.outbound
            for n in range(5):
                t_start = time.perf_counter()
                outbound.enqueue(tone(2.0, 24000, 800.0), 24000, n)
                outbound.end(n)

                def loud_for(seconds: float, since: float = t_start) -> bool:
                    return len([r for r in bot.audio if r.t > since and rms(r.samples) > 0.1]) * 0.02 >= seconds

                assert await bot.wait_for(lambda: loud_for(0.2), 30.0)
                await asyncio.sleep(0.004 * n)  # flushes at several points of the 20 ms slot
                t_flush = time.perf_counter()
                assert outbound.flush() > 0
                in_flight.append(t_flush - max(t for tag, _, t in agent.published if tag == n))
                await asyncio.sleep(0.4)
                # Nothing queued before the flush was published after it, and no playout-done.
                assert all(t <= t_flush for tag, _, t in agent.published if tag == n)
                assert all(tag != n for tag, _ in agent.drained)
                after = [r for r in bot.audio if r.t > t_flush]
                last_loud = max((i for i, r in enumerate(after) if rms(r.samples) >= SILENT_RMS), default=-1)
                assert last_loud + 1 < len(after), "the bot never heard silence after the flush"
                delays.append(after[last_loud + 1].t - t_flush)
            await bot.hang_up()
        return delays

    delays: list[float] = []

    async def collect() -> None:
        delays.extend(await call())

    run(collect())
    ms = sorted(round(1000 * d, 1) for d in delays)
    record_property("flush_to_silence_ms", ms)
    print(f"flush->silence at the bot (ms): {ms}, median {statistics.median(ms)}; the last frame before the "
          f"flush was published {[round(1000 * d, 1) for d in in_flight]} ms before it")  # fmt: skip
    # What is asserted above is the property: nothing queued before a flush is published after it, and
    # the bot hears silence. How soon (a frame plus aiortc's jitter buffer, ~100 ms on an idle machine,
    # printed) depends on scheduling, so the bound here only says "not stuck".
    assert max(ms) < 3000


def test_events_flow_both_ways_and_malformed_messages_are_ignored() -> None:
    async def call() -> None:
        agent = Agent()
        async with agent_server(agent) as app:
            bot = AgentBot()
            await bot.connect(app.state.url)
            hello = await bot.wait_event("hello", 30.0)
            assert hello == {"type": "hello", "call_id": bot.call_id}  # sent before the channel opened
            raw = bot.channel.channel
            for bad in ("not json", "[1, 2]", '"text"', b"\x00\x01"):
                raw.send(bad)
            assert bot.send_event({"type": "ping", "n": 1})
            session = agent.session
            assert await wait_until(lambda: bool(agent.messages), 30.0)
            assert agent.messages == [{"type": "ping", "n": 1}]
            assert session.events.malformed == 4 and session.events.received == 1
            assert session.send_event({"type": "pong"})
            assert (await bot.wait_event("pong", 30.0)) == {"type": "pong"}
            with pytest.raises(TypeError):
                session.send_event({"type": "bad", "value": object()})
            await bot.hang_up()
            await session.closed.wait()
            assert not session.send_event({"type": "late"}) and session.events.dropped == 1

    run(call())


def test_signalling_errors_are_typed() -> None:
    async def call() -> None:
        agent = Agent()
        async with agent_server(agent, max_calls=1) as app:
            url = app.state.url
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:

                async def offer(body: Any, raw: bytes | None = None) -> httpx.Response:
                    return await http.post("/v1/agent/offer", content=raw, json=None if raw else body)

                def error(r: httpx.Response, status: int, code: str) -> str:
                    assert r.status_code == status, r.text
                    assert r.json()["error"]["code"] == code
                    return r.json()["error"]["message"]

                error(await offer(None, b"{not json"), 400, "invalid_request")
                assert "sdp" in error(await offer({"type": "offer"}), 400, "invalid_request")
                assert "type" in error(await offer({"sdp": "v=0", "type": "answer"}), 400, "invalid_request")
                error(await offer({"sdp": "v=0", "type": "offer", "extra": 1}), 400, "invalid_request")
                assert "not SDP" in error(await offer({"sdp": "hello", "type": "offer"}), 400, "invalid_sdp")
                broken = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
                assert "could not be applied" in error(await offer({"sdp": broken, "type": "offer"}), 400,
                                                       "invalid_sdp")  # fmt: skip
                assert "no audio" in error(await offer({"sdp": await data_only_offer(), "type": "offer"}), 400,
                                           "invalid_sdp")  # fmt: skip
                error(await http.delete("/v1/agent/nope"), 404, "not_found")
                assert len(app.state.agent_calls) == 0  # refused offers hold no slot

                bot = AgentBot()
                await bot.connect(url)
                with pytest.raises(BotError, match=r"503.*busy"):
                    await AgentBot().connect(url)
                r = await http.delete(f"/v1/agent/{bot.call_id}")
                assert r.status_code == 200 and r.json() == {"call_id": bot.call_id, "closed": True}
                assert agent.session.closed.is_set() and len(app.state.agent_calls) == 0
                error(await http.delete(f"/v1/agent/{bot.call_id}"), 404, "not_found")
                await bot.close()

                again = AgentBot()  # the slot is free again; a peer that just leaves frees it too
                await again.connect(url)
                await again.close()
                assert await wait_until(lambda: len(app.state.agent_calls) == 0, 30.0)

    run(call())


def test_default_agent_greets_with_a_tone() -> None:
    async def call() -> None:
        async with agent_server() as app:
            bot = AgentBot()
            await bot.connect(app.state.url)
            assert (await bot.wait_event("greeting.done", 30.0)) is not None
            assert await bot.wait_for(lambda: len(bot.audio) > 0 and rms(bot.received_audio()) > 0.05, 30.0)
            await bot.hang_up()
            assert rms(bot.received_audio()) > 0.05
            assert [e["type"] for _, e in bot.events] == ["call.started", "greeting.done"]

    run(call())


def test_agent_bot_cli_says_a_wav_and_writes_the_reply(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(engine="tone", warmup=False, starter_cache=False, llm_embedded=False, agent_max_calls=0)
    app = create_app(settings, engine=create_tone(settings))
    app.include_router(router)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)  # the CLI runs its own event loop
    thread.start()
    try:
        deadline = time.perf_counter() + 10
        while not server.started and time.perf_counter() < deadline:
            time.sleep(0.01)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        wav, out = tmp_path / "user.wav", tmp_path / "reply.wav"
        wav.write_bytes(wav_bytes(tone(0.3, 16000, 300.0), 16000))
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--url", url, "--wav", str(wav), "--out", str(out), "--wait-s", "0.3"])
        assert run_agent_bot(args) == 0
    finally:
        server.should_exit = True
        thread.join(10)
    printed = capsys.readouterr().out
    assert "events: ['call.started', 'greeting.done']" in printed
    reply, rate = decode_wav(out.read_bytes())
    assert rate == 16000 and rms(reply) > 0.05  # the greeting tone
    onset = int(np.flatnonzero(np.abs(reply) > 0.05)[0])
    assert peak_hz(reply[onset : onset + 16000 // 5], 16000) == pytest.approx(440.0, abs=10.0)
    from voxgate.cli import main  # what fails is the CLI's one line and exit 2, as every command's

    assert main(["agent-bot", "--url", url, "--wav", str(tmp_path / "missing.wav")]) == 2
    assert capsys.readouterr().err.startswith("voxgate: error: os_error: No such file")
    assert main(["agent-bot", "--url", "http://127.0.0.1:9", "--wav", str(wav)]) == 2  # nobody listens there
    assert capsys.readouterr().err.startswith("voxgate: error: agent_bot_error: cannot talk to http://127.0.0.1:9")


async def data_only_offer() -> str:
    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


async def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not predicate() and time.perf_counter() < deadline:
        await asyncio.sleep(0.02)
    return predicate()
