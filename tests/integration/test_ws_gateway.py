"""The WebSocket TTS gateway on a real server (tone engine) over loopback: the protocol of
docs/protocol.md, cancel, resume, backpressure, pacing, bad input (vLLM-Omni's path: test_omni_socket.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import re
import socket
import time
from collections.abc import Iterator

import av
import httpx
import pytest
import websockets

from tests.conftest import metric
from tests.integration.wsclient import Client
from voxgate.bench.server import ServerProcess
from voxgate.serving.ws import STARVING_S, WS_PIECE_MS


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerProcess]:
    env = {"TONE_DELAY_MS": "5", "WS_RESUME_WINDOW_S": "1.5", "API_KEYS": "k1", "MAX_STREAMS_PER_CLIENT": "64"}
    with ServerProcess("tone", env=env) as server:
        yield server


def _ws(server: ServerProcess, path: str = "/v1/tts/ws", key: str = "k1") -> str:
    return server.url.replace("http://", "ws://") + path + (f"?api_key={key}" if key else "")


def _covered(messages: list[dict]) -> list[int]:
    return [u for m in messages if m["type"] == "units.done" for u in range(m["unit_start"], m["unit_end"] + 1)]


def test_a_session_speaks_every_unit_once_and_reuses_the_socket(gateway):
    async def run() -> tuple[str, int]:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.send(type="session.start", max_pending_units=4)
            started = await c.next()
            assert started["type"] == "session.started" and started["sample_rate"] == 24000
            await c.words("The first utterance has a few words. And a second sentence here")
            await c.send(type="text.end")
            done = await c.until("utterance.done")
            assert done == {"type": "utterance.done", "utterance": 0, "status": "completed", "unit_end": 11}
            await c.words("Then another one")
            await c.send(type="session.end")
            finished = await c.until("session.done")
            assert finished["units"] == 15
            with pytest.raises(websockets.ConnectionClosedOK):
                await c.next()
        assert _covered(c.messages) == list(range(15))
        audio = c.of("audio")
        assert [m["seq"] for m in audio] == list(range(len(audio)))
        assert all(m["bytes"] == 2 * m["samples"] for m in audio)
        assert [m["utterance"] for m in c.of("units.done")][-1] == 1
        # The segments as the client heard them (how the text is cut depends on when each word
        # arrives: a stalled client's listener may run dry and restart the sizes).
        return started["session_id"], len({(m["unit_start"], m["unit_end"]) for m in c.of("units.done")})

    session_id, segments = asyncio.run(run())
    timings = httpx.get(gateway.url + "/debug/timings?last=1000", headers=gateway.admin_headers()).json()
    ours = [t for t in timings["timings"] if t["request_id"].startswith(session_id)]
    assert len(ours) == segments >= 5 and sum(t["opens_utterance"] for t in ours) == 2  # one per segment, 2 utterances
    assert all(0 <= t["ttfa_ms"] < 5000 for t in ours)
    for t in ours:  # the stages partition the segment's first-audio latency (each rounded to a microsecond)
        assert list(t["stages_ms"]) == ["queue", "slot", "engine", "hop", "write"]
        assert sum(t["stages_ms"].values()) == pytest.approx(t["ttfa_ms"], abs=0.01)
    metrics = httpx.get(gateway.url + "/metrics", headers=gateway.admin_headers()).text
    assert 'voxgate_first_audio_stage_seconds_count{endpoint="/v1/tts/ws",stage="engine"}' in metrics


def test_base64_audio_and_mulaw_at_8k(gateway):
    async def run() -> None:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.send(type="session.start", format="mulaw", binary=False)
            assert (await c.next())["sample_rate"] == 8000
            await c.words("Telephone audio please.")
            await c.send(type="text.end")
            await c.until("utterance.done")
        audio = c.of("audio")
        assert audio and all(len(base64.b64decode(m["data"])) == m["samples"] == m["bytes"] for m in audio)

    asyncio.run(run())


def test_bad_input_gets_typed_errors_and_hurts_no_one(gateway):
    async def bystander() -> list[int]:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.send(type="session.start")
            await c.next()
            for _ in range(5):
                await c.words("steady words keep coming")
                await asyncio.sleep(0.05)
            await c.send(type="text.end")
            await c.until("utterance.done")
            assert not c.of("error")
            return _covered(c.messages)

    async def attacker() -> list[str]:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.send(type="text.delta", text="too early ", first_unit_index=0)
            for raw in ["{not json", "[1, 2]", json.dumps({"type": "nope"}), json.dumps({"type": "text.delta"}),
                        "x" * 65600]:  # fmt: skip  # over the 64 KiB limit, within the frame parser's slack
                await ws.send(raw)
            await ws.send(b"\x00\x01binary")
            await c.send(type="session.start", voice="no-such-voice")
            await c.send(type="session.start", format="flac")
            codes = [(await c.next())["code"] for _ in range(9)]
            await c.send(type="session.start")
            assert (await c.next())["type"] == "session.started"  # the socket still works
            await c.send(type="session.start")
            await c.words("one two")
            await c.send(type="text.delta", text="gap ", first_unit_index=5)
            await c.send(type="text.delta", text="again ", first_unit_index=1)
            await c.send(type="text.end")
            await c.send(type="text.delta", text="late ", first_unit_index=2)
            for _ in range(4):
                codes.append((await c.until("error"))["code"])
            assert all(not m["fatal"] for m in c.of("error"))
            assert (await c.until("utterance.done"))["unit_end"] == 1
            return codes

    async def run() -> None:
        codes, covered = await asyncio.gather(attacker(), bystander())
        assert codes == ["no_session", "invalid_message", "invalid_message", "unknown_type", "invalid_message",
                         "message_too_large", "binary_not_supported", "unknown_voice", "unsupported_format",
                         "session_exists", "unit_gap", "unit_overlap", "utterance_ending"]  # fmt: skip
        assert covered == list(range(20))

    asyncio.run(run())
    assert httpx.get(gateway.url + "/healthz").status_code == 200


def test_a_wrong_key_is_refused_before_any_message(gateway):
    async def run() -> None:
        async with websockets.connect(_ws(gateway, key="wrong")) as ws:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd.code == 4401

    asyncio.run(run())


def test_cancel_stops_audio_within_a_chunk_and_the_session_goes_on(gateway):
    async def run() -> None:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.start(max_pending_units=40, pacing=True, pacing_lead_ms=0)
            await c.words(" ".join(["long"] * 40))  # 4.8 s of audio, paced at real time
            await c.until("audio")
            await c.send(type="cancel")
            sent_at, t_cancel = len(c.of("audio")), time.perf_counter()
            done = await c.until("utterance.done")
            elapsed = time.perf_counter() - t_cancel
            assert done["status"] == "cancelled" and done["unit_end"] == 39
            # Paced at real time, the server sends a chunk per chunk of wall time: after the cancel
            # comes at most the chunk on the wire plus what pacing released while the cancel travelled
            # (one chunk on an idle machine; more only if this process was starved of CPU).
            audio = c.of("audio")
            chunk_s = max(m["samples"] for m in audio) / 24000
            assert len(audio) - sent_at <= 1 + math.ceil(elapsed / chunk_s)
            assert sum(m["samples"] for m in audio) < 4.8 * 24000  # the utterance was cut short
            await c.words("after the cancel")
            await c.send(type="text.end")
            done = await c.until("utterance.done")
            assert done == {"type": "utterance.done", "utterance": 1, "status": "completed", "unit_end": 42}

    asyncio.run(run())


def test_pacing_sends_audio_at_real_time(gateway):
    async def run() -> float:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.start(max_pending_units=10, pacing=True, pacing_lead_ms=200)
            await c.words("one two three four five six seven eight nine ten")  # 1.2 s of audio
            t0 = time.perf_counter()
            await c.send(type="text.end")
            await c.until("utterance.done")
            return time.perf_counter() - t0

    # 1.2 s of audio less the 0.2 s lead: pacing holds it back at least that long (a busy machine
    # can only make it later, so the bound cannot flake); the upper bound is only "not stuck".
    assert 0.8 <= asyncio.run(run()) <= 30.0


def test_pacing_holds_back_audio_within_an_engine_chunk():
    """An engine's long chunk (here 1.2 s: ten tone units; piper's is a sentence) goes out in
    pieces of at most WS_PIECE_MS, each paced: with no lead, 1.2 s of audio takes at least
    1.2 s less the one piece that may be ahead (a busy machine can only make it later)."""
    env = {"TONE_UNITS_PER_CHUNK": "10", "API_KEYS": "k1"}
    with ServerProcess("tone", env=env) as server:

        async def run() -> tuple[float, list[dict]]:
            async with websockets.connect(_ws(server)) as ws:
                c = Client(ws)
                await c.start(max_pending_units=10, starter_units=0, pacing=True, pacing_lead_ms=0)
                await c.words("one two three four five six seven eight nine ten")
                t0 = time.perf_counter()
                await c.send(type="text.end")
                await c.until("utterance.done")
                return time.perf_counter() - t0, c.of("audio")

        elapsed, audio = asyncio.run(run())
    rate = 24000  # the tone engine's
    assert sum(m["samples"] for m in audio) == round(1.2 * rate)
    assert max(m["samples"] for m in audio) <= WS_PIECE_MS * rate // 1000
    assert 1.2 - WS_PIECE_MS / 1000 <= elapsed <= 30.0


@pytest.mark.parametrize("one_delta", [False, True], ids=["word by word", "one delta"])
def test_resume_after_a_drop_replays_with_no_gap_and_no_duplicate(gateway, one_delta):
    """Also when all the text came in one delta: it is cut into segments of the pending limit
    like streamed text (one segment of it all gave no units.done to resume from)."""

    async def run() -> None:
        first = await websockets.connect(_ws(gateway))
        c = Client(first)
        await c.send(type="session.start", max_pending_units=2)
        started = await c.next()
        session_id, token = started["session_id"], started["resume_token"]
        if one_delta:
            await c.send(type="text.delta", text="a b c d e f g h i j ", first_unit_index=0)
        else:
            await c.words("a b c d e f g h i j")
        for _ in range(2):
            done = await c.until("units.done")
            assert done["unit_end"] - done["unit_start"] < 2
        first.transport.abort()  # no close frame: a network drop
        kept = [m for m in c.messages if m["type"] == "units.done"]
        last = kept[-1]["unit_end"]
        last_seq = max(m["seq"] for m in c.messages if m["type"] == "audio" and m["unit_end"] <= last)
        async with websockets.connect(_ws(gateway)) as second:
            r = Client(second)
            resume = {"session_id": session_id, "resume_token": token, "last_unit_index_received": last}
            await r.send(type="session.start", resume=resume)
            started = await r.next()
            assert started["resumed"] and started["next_unit_index"] == 10
            await r.send(type="text.end")
            await r.until("utterance.done")
        assert _covered(kept) + _covered(r.messages) == list(range(10))
        seqs = [m["seq"] for m in r.of("audio")]
        assert seqs == list(range(last_seq + 1, last_seq + 1 + len(seqs)))  # on from the last kept, no gap

    asyncio.run(run())


def test_resume_is_refused_past_the_window_or_for_an_unknown_session(gateway):
    async def run() -> None:
        first = await websockets.connect(_ws(gateway))
        c = Client(first)
        await c.send(type="session.start")
        started = await c.next()
        session_id, token = started["session_id"], started["resume_token"]
        first.transport.abort()
        await asyncio.sleep(1.5 + 3.0)  # the module's server keeps sessions 1.5 s from the disconnect
        async with websockets.connect(_ws(gateway)) as ws:
            r = Client(ws)
            for sid in (session_id, "unknown"):
                resume = {"session_id": sid, "resume_token": token, "last_unit_index_received": -1}
                await r.send(type="session.start", resume=resume)
                refused = await r.next()
                assert refused["code"] == "resume_not_available" and not refused["fatal"]
            await r.send(type="session.start")
            assert (await r.next())["type"] == "session.started"

    asyncio.run(run())


def test_a_client_that_stops_reading_is_warned_then_dropped_and_others_are_not_slowed():
    """While one client's session is stuck behind its full send queue (warned, not yet dropped:
    the 5 s grace is the stated tolerance, 50x what tone needs), another client is served in
    full; then the stuck socket is dropped, and its session resumes."""
    env = {"TONE_UNIT_MS": "2000", "WS_SEND_QUEUE_BYTES": "65536", "WS_BACKPRESSURE_WARN_S": "0.3",
           "WS_BACKPRESSURE_GRACE_S": "5", "MAX_STREAMS_PER_CLIENT": "64"}  # fmt: skip
    with ServerProcess("tone", env=env) as server:

        def count(name: str) -> float:
            return metric(server, name, server.admin_headers())

        async def until(predicate) -> None:
            for _ in range(1200):  # 60 s: a deadline for a busy machine, not a measurement
                if await asyncio.to_thread(predicate):
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("the server never got there")

        async def stalled() -> tuple[dict, list[dict]]:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
            ws = await websockets.connect(_ws(server, key=""), sock=sock, max_queue=1, max_size=None)
            c = Client(ws)
            await c.send(type="session.start", max_pending_units=1)
            started = await c.next()
            await c.words(" ".join(["word"] * 60))  # 2 minutes of audio, 5.8 MB
            await until(lambda: count("voxgate_ws_sessions_detached") == 1)  # not reading until dropped
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await c.next()
            return started, c.messages

        async def reader() -> float:
            async with websockets.connect(_ws(server, key="")) as ws:
                c = Client(ws)
                await c.send(type="session.start")
                await c.next()
                await c.words("a quick one.")
                await c.until("units.done")
                detached = count("voxgate_ws_sessions_detached")
                await c.send(type="session.end")  # ended, so it is never counted as detached
                await c.until("session.done")
                return detached

        async def run() -> None:
            stalled_task = asyncio.create_task(stalled())
            await until(lambda: count('voxgate_errors_total{code="backpressure"}') >= 1)  # stuck and warned
            assert await reader() == 0  # served in full while the stuck socket was still attached
            started, messages = await stalled_task
            async with websockets.connect(_ws(server, key="")) as ws:  # the session can be resumed
                c = Client(ws)
                last = max([m["unit_end"] for m in messages if m["type"] == "units.done"], default=-1)
                resume = {"session_id": started["session_id"], "resume_token": started["resume_token"],
                          "last_unit_index_received": last}  # fmt: skip
                await c.send(type="session.start", resume=resume)
                assert (await c.next())["resumed"]
                told = await c.next()  # and says why the socket went
                assert told["type"] == "error" and told["code"] == "backpressure" and not told["fatal"]
                await c.until("units.done")

        asyncio.run(run())
        metrics = httpx.get(server.url + "/metrics").text
        assert 'voxgate_errors_total{code="backpressure"}' in metrics and "voxgate_ws_tasks" in metrics
        starving = re.search(r"^voxgate_ws_starving_seconds (\S+)$", metrics, re.MULTILINE)
        assert starving and STARVING_S[0] <= float(starving.group(1)) <= STARVING_S[1]


def test_an_engine_failure_fails_its_segment_only(gateway):
    async def run() -> None:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.start(max_pending_units=2)
            await c.words("fine words [[fail]] here then more words.")
            await c.send(type="text.end")
            await c.until("utterance.done")
        failed = [m for m in c.of("error") if m["code"] == "engine_error"]
        assert len(failed) == 1 and not failed[0]["fatal"]
        assert _covered(c.messages) == list(range(7))  # the failed segment's units are reported too

    asyncio.run(run())


@pytest.fixture(scope="module")
def patient_gateway() -> Iterator[ServerProcess]:
    """No idle flush (a minute): a segment is cut only by what the text says. A second of audio a
    unit: a listener never runs dry while its text comes (a starved one would restart the sizes),
    however slowly a busy machine wakes the client for its next words."""
    with ServerProcess("tone", env={"WS_IDLE_FLUSH_MS": "60000", "TONE_UNIT_MS": "1000"}) as server:
        yield server


def test_streamed_text_is_spoken_after_its_first_words_and_segments_grow(patient_gateway):
    """An LLM's words one by one: the first audio needs only the first three (the starter), not
    a sentence or twelve words; then segments of 6 and 12 units. Without a starter the same
    three words wait (here: for text.end)."""

    async def run(config: dict) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        async with websockets.connect(_ws(patient_gateway, key="")) as ws:
            c = Client(ws)
            await c.start(**config)
            await c.words("one two three")
            first = await c.until("units.done") if config.get("starter_units", 3) else None
            await c.words(" ".join(f"w{i}" for i in range(3, 40)))
            await c.send(type="text.end")
            await c.until("utterance.done")
            ranges = [(m["unit_start"], m["unit_end"]) for m in c.of("units.done")]
            return ranges, [(first["unit_start"], first["unit_end"])] if first else []

    ranges, first = asyncio.run(run({}))
    assert first == [(0, 2)]  # spoken with no more text and no idle flush
    assert ranges == [(0, 2), (3, 8), (9, 20), (21, 32), (33, 39)]
    ranges, _ = asyncio.run(run({"starter_units": 0}))
    assert ranges == [(0, 11), (12, 23), (24, 35), (36, 39)]


def test_a_starter_that_is_a_cached_opener_is_played_from_the_cache(patient_gateway):
    async def run() -> list[dict]:
        async with websockets.connect(_ws(patient_gateway, key="")) as ws:
            c = Client(ws)
            await c.start()
            await c.words("Sure. Let me look")
            await c.send(type="text.end")
            await c.until("utterance.done")
            return c.messages

    hits = metric(patient_gateway, "voxgate_starter_cache_hits_total")
    messages = asyncio.run(run())
    assert metric(patient_gateway, "voxgate_starter_cache_hits_total") == hits + 1
    assert [(m["unit_start"], m["unit_end"]) for m in messages if m["type"] == "units.done"] == [(0, 0), (1, 3)]


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_compressed_formats_make_each_segment_a_whole_stream_of_the_same_audio(gateway, fmt):
    """Each segment's pieces, joined, decode on their own (a cancel or a resume works by whole
    segments, so a decoder never gets half a stream), and the headers count the same samples as
    PCM does for the same text (tone: exact); the decoded audio is that long but for the codec's
    padding (at most one frame a segment, plus Opus's pre-skip)."""
    text = "Compressed audio over the socket, cut into a few segments for the check."

    async def session(config: dict) -> Client:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            started = await c.start(max_pending_units=4, **config)
            assert started["type"] == "session.started" and started["format"] == config["format"]
            await c.words(text)
            await c.send(type="session.end")
            await c.until("session.done")
            return c

    async def run() -> tuple[Client, Client]:
        return await session({"format": fmt}), await session({"format": "pcm16"})

    compressed, pcm = asyncio.run(run())
    samples = sum(m["samples"] for m in compressed.of("audio"))
    assert samples == sum(m["samples"] for m in pcm.of("audio")) > 0
    segments: dict[int, bytes] = {}
    for m in compressed.of("audio"):
        segments[m["unit_start"]] = segments.get(m["unit_start"], b"") + m["payload"]
    assert len(segments) >= 3
    decoded = 0
    for data in segments.values():
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            decoded += sum(frame.samples for frame in container.decode(stream)) * 24000 // stream.rate
    assert samples <= decoded <= samples + len(segments) * 2048 + 312  # mp3 1152, AAC 2048, Opus 480 a frame


def test_a_format_the_socket_cannot_stream_is_refused_by_name(gateway):
    async def run() -> dict:
        async with websockets.connect(_ws(gateway)) as ws:
            return await Client(ws).start(format="flac")

    refused = asyncio.run(run())
    assert refused["type"] == "error" and refused["code"] == "unsupported_format" and "mp3" in refused["message"]


def test_segments_utterance_speaks_each_utterance_whole_at_its_end(gateway):
    async def run() -> Client:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.start(segments="utterance", max_pending_units=2)
            await c.words("One sentence here. Another one, with a clause. And a third")
            await c.send(type="text.end")
            await c.until("utterance.done")
            return c

    c = asyncio.run(run())
    assert [(m["unit_start"], m["unit_end"]) for m in c.of("units.done")] == [(0, 10)]  # one segment, all 11 units


def test_a_listener_that_ran_dry_mid_utterance_gets_a_starter_sized_segment_not_a_full_one(gateway):
    """Text slower than speech: once the listener has played everything it was sent, the next
    segment is cut at the starter's size (3 words here) as soon as it has them, instead of
    waiting for a full one (12) or the idle flush. Two deltas sent back to back tell the two
    apart: the starved rule cuts after the first (units 9-11), a full-segment wait would take both.
    No step depends on how fast either side runs: the first two segments are one delta each (a
    delta is never split, starved or not), and the wait is on the listener's clock as the server
    keeps it (audio plays from when it arrives, gaps included), which the client's arrivals trail."""

    async def run() -> list[tuple[int, int]]:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.start(starter_units=3, max_pending_units=12)
            await c.send(type="text.delta", text="one two three ", first_unit_index=0)  # the starter (0-2)
            await c.send(type="text.delta", text="four five six seven eight nine ", first_unit_index=3)
            played_out = 0.0  # when the listener has played all it got (`speech/clock.py`)
            while True:
                m = await c.next()
                if m["type"] == "audio":
                    played_out = max(played_out, time.perf_counter()) + m["samples"] / 24000
                if m["type"] == "units.done" and m["unit_end"] == 8:
                    break
            await asyncio.sleep(max(0.0, played_out - time.perf_counter()) + 0.5)
            await c.send(type="text.delta", text="ten eleven twelve ", first_unit_index=9)
            await c.send(type="text.delta", text="thirteen fourteen ", first_unit_index=12)
            await c.send(type="text.end")
            await c.until("utterance.done")
        return [(m["unit_start"], m["unit_end"]) for m in c.of("units.done")]

    assert asyncio.run(run()) == [(0, 2), (3, 8), (9, 11), (12, 13)]


def test_a_delta_with_nothing_to_speak_is_accounted_not_refused(gateway):
    """One-shot requests refuse text with nothing to speak (`empty_text`); a streamed delta is
    part of a longer text, and its units are accounted as any others."""

    async def run() -> Client:
        async with websockets.connect(_ws(gateway)) as ws:
            c = Client(ws)
            await c.start()
            await c.send(type="text.delta", text="... ", first_unit_index=0)
            await c.send(type="session.end")
            await c.until("session.done")
            return c

    client = asyncio.run(run())
    assert not client.of("error") and _covered(client.messages) == [0]
