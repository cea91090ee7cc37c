"""The qwen3 engine behind the real HTTP server, and its commands."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from voxgate.bench.server import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3_server(tiny_dirs):
    env = {"QWEN3_MODEL_DIR": str(tiny_dirs["cv06"]), "STARTER_CACHE": "false", "QWEN3_PACKET_FRAMES": "2"}
    with ServerProcess("qwen3", env=env) as server:
        yield server


def test_qwen3_streams_from_the_server_deterministically_with_a_seed(qwen3_server):
    body = {"text": "Hello from the talker.", "voice": "vivian", "language": "en", "seed": 5}
    first = httpx.post(f"{qwen3_server.url}/tts/stream", json=body, timeout=120)
    second = httpx.post(f"{qwen3_server.url}/tts/stream", json=body, timeout=120)
    assert first.status_code == 200 and first.headers["x-sample-rate"] == "24000"
    assert len(first.content) > 0 and len(first.content) % (1920 * 2) == 0  # whole 80 ms frames
    assert first.content == second.content
    other = httpx.post(f"{qwen3_server.url}/tts/stream", json={**body, "seed": 6}, timeout=120)
    assert other.content != first.content


def test_qwen3_voices_and_bad_speaker(qwen3_server):
    voices = httpx.get(f"{qwen3_server.url}/v1/voices").json()
    assert {"vivian", "ryan", "eric"} <= {v["id"] for v in voices["voices"]}
    r = httpx.post(f"{qwen3_server.url}/tts/stream", json={"text": "hi", "voice": "nobody"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_voice"


def test_make_random_checkpoint_and_bench_tts_commands(tmp_path):
    out = tmp_path / "ck"
    run = [sys.executable, "-m", "voxgate"]
    made = subprocess.run([*run, "make-random-checkpoint", "--model", "Qwen3-TTS-12Hz-0.6B-CustomVoice",
                           "--out", str(out), "--tiny"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert (out / "model.safetensors").is_file() and (out / "speech_tokenizer/model.safetensors").is_file()
    report = tmp_path / "tts.json"
    bench = subprocess.run([*run, "bench", "tts", "--model-dir", str(out), "--frames", "4", "--runs", "1",
                            "--packet-frames", "1,2", "--output-json", str(report)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    result = json.loads(report.read_text())["result"]
    assert result["mode"] == "eager" and result["frames"] == 4 and set(result["packets"]) == {"1", "2"}
    assert result["packets"]["1"]["rtf"] > 0 and result["packets"]["1"]["ttfa_ms_p50"] > 0
    batched = subprocess.run([*run, "bench", "tts", "--model-dir", str(out), "--frames", "4", "--runs", "1",
                              "--packet-frames", "1", "--mode", "batched", "--concurrency", "1,3",
                              "--output-json", str(report)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert batched.returncode == 0, batched.stderr
    result = json.loads(report.read_text())["result"]
    assert result["mode"] == "batched" and [row["streams"] for row in result["concurrency"]] == [1, 3]
    assert all(not row["errors"] and row["audio_s_per_s"] > 0 for row in result["concurrency"])
    assert "| streams |" in batched.stdout


def test_unknown_model_name_is_refused(tmp_path):
    made = subprocess.run(
        [sys.executable, "-m", "voxgate", "make-random-checkpoint", "--model", "nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 2 and "invalid choice" in made.stderr


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"text": "Hallo.", "voice": "vivian", "language": "nl"}, 400, "unsupported_language"),
        ({"text": "Design.", "voice": "vivian", "speed": 9.0}, 400, "invalid_request"),
    ],
)
def test_qwen3_refusals_are_typed_not_500(qwen3_server, body, status, code):
    r = httpx.post(f"{qwen3_server.url}/tts/stream", json=body, timeout=60)
    assert r.status_code == status and r.json()["error"]["code"] == code


def test_another_speaking_rate_is_served_as_the_same_speech_stretched(qwen3_server):
    def samples(speed: float) -> int:
        body = {"text": "Faster, please.", "voice": "vivian", "seed": 3, "speed": speed, "format": "pcm"}
        r = httpx.post(f"{qwen3_server.url}/tts/stream", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return len(r.content) // 2

    normal, fast = samples(1.0), samples(2.0)  # the same seed: the same codes, then stretched
    assert normal > 0 and abs(fast - normal / 2) <= max(0.01 * normal / 2, 600)


def test_engine_counters_reach_metrics(qwen3_server):
    httpx.post(f"{qwen3_server.url}/tts/stream", json={"text": "Count.", "voice": "ryan", "seed": 2}, timeout=120)
    text = httpx.get(f"{qwen3_server.url}/metrics").text
    assert 'voxgate_engine_graph_replays_total{name="decode_step"} 0.0' in text
    served = [
        line
        for line in text.splitlines()
        if line.startswith('voxgate_engine_eager_fallbacks_total{name="no_graphs_cpu"}')
    ]
    assert served and float(served[0].split()[-1]) >= 1  # on the CPU every stream runs eagerly, and says so


def test_the_polled_runner_path_and_its_16_bit_pcm_serve_the_same_bytes(tiny_dirs):
    """`VOXGATE_ENGINE_POLLED` (frames handed to the event loop, no thread per stream) and
    `VOXGATE_QWEN3_PCM16_STEP` (16-bit PCM made once per step) change how audio travels, not
    what it is: the batched server's seeded streams are byte for byte the same in every format."""
    base = {"QWEN3_MODEL_DIR": str(tiny_dirs["cv06"]), "STARTER_CACHE": "false", "QWEN3_BATCHED": "true",
            "QWEN3_KV_CAPACITY": "256", "QWEN3_MAX_STREAMS": "4"}  # fmt: skip
    body = {"text": "Frames to the loop.", "voice": "vivian", "language": "en", "seed": 5}
    got = {}
    off, on = {"ENGINE_POLLED": "false", "QWEN3_PCM16_STEP": "false"}, {}  # on by default
    for name, extra in (("threads", off), ("polled", on)):
        with ServerProcess("qwen3", env={**base, **extra}) as server:
            replies = [httpx.post(f"{server.url}/tts/stream", json={**body, "format": fmt}, timeout=120)
                       for fmt in ("pcm", "wav", "mulaw")]  # fmt: skip
            assert all(r.status_code == 200 and r.content for r in replies), [r.text[:200] for r in replies]
            got[name] = [r.content for r in replies]
    assert got["polled"] == got["threads"]


def test_a_batched_sessions_first_audio_splits_the_engine_stage_by_the_runners_clocks(tiny_dirs):
    """The batched runner stamps a stream's first chunk (submitted, first step launched, first
    frame handed out): `/debug/timings` splits the gateway's engine stage by them, in order,
    adding up to it (each part rounded to a microsecond); `at_ms` has every reading in causal
    order and `batch` how its first step was made up."""
    import asyncio

    import websockets

    from tests.integration.wsclient import Client

    env = {"QWEN3_MODEL_DIR": str(tiny_dirs["cv06"]), "STARTER_CACHE": "false", "QWEN3_BATCHED": "true",
           "QWEN3_KV_CAPACITY": "256", "QWEN3_MAX_STREAMS": "4"}  # fmt: skip

    async def session(url: str) -> str:
        async with websockets.connect(url.replace("http", "ws") + "/v1/tts/ws") as ws:
            c = Client(ws)
            started = await c.start(voice="vivian", language="en")
            await c.words("Two short sentences. Here is the second")
            await c.send(type="session.end")
            await c.until("session.done", timeout=120)
            return started["session_id"]

    with ServerProcess("qwen3", env=env) as server:
        session_id = asyncio.run(session(server.url))
        rows = httpx.get(f"{server.url}/debug/timings?last=100", headers=server.admin_headers()).json()["timings"]
    ours = [t for t in rows if t["status"] == "first_audio" and t["request_id"].startswith(session_id)]
    assert ours
    for t in ours:
        split = t["engine_ms"]
        assert list(split) == ["open", "wait", "gpu", "pickup"] and min(split.values()) >= 0
        assert sum(split.values()) == pytest.approx(t["stages_ms"]["engine"], abs=0.01)
        assert split["gpu"] > 0  # the tiny model's prefill and first step on the CPU take time
        at = t["at_ms"]  # every reading, in causal order on one clock
        assert list(at) == ["ready", "taken", "slot", "submitted", "prefill", "first_step", "first_frame", "chunk",
                            "hop", "written"]  # fmt: skip
        assert list(at.values()) == sorted(at.values())
        assert at["written"] - at["ready"] == pytest.approx(t["ttfa_ms"], abs=0.01)
        assert 1 <= t["batch"]["admitted_with"] <= t["batch"]["first_step_rows"]


def test_a_dropped_session_gives_its_row_to_a_listener_and_gets_its_segment_whole_on_resume(tiny_dirs, tmp_path):
    """One engine row. Session A's segment is running when its socket drops; session B then
    needs the row: A's stream gives it up (`Preempted`, or parked once A's output is full), B
    is voiced to its end, and A, resuming, gets its segment voiced again, whole, once: every
    unit, one units.done, nothing of the stopped attempt."""
    import asyncio
    import re
    import shutil
    import time

    import websockets

    from tests.integration.wsclient import Client

    model = tmp_path / "greedy"  # greedy: the same codes every run (no EOS drawn by chance)
    shutil.copytree(tiny_dirs["cv06"], model)
    config = json.loads((model / "generation_config.json").read_text())
    greedy = {**config, "do_sample": False, "subtalker_dosample": False}
    (model / "generation_config.json").write_text(json.dumps(greedy))
    env = {"QWEN3_MODEL_DIR": str(model), "STARTER_CACHE": "false", "QWEN3_BATCHED": "true",
           "QWEN3_MAX_STREAMS": "1", "QWEN3_KV_CAPACITY": "512", "WS_SEND_QUEUE_BYTES": "4096",
           "WS_RESUME_WINDOW_S": "300"}  # fmt: skip
    words = "A rather long sentence that the first listener will not hear to its end today."

    def metric(server, name: str) -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    async def run(server) -> tuple[list[dict], list[dict], list[dict]]:
        url = server.url.replace("http", "ws") + "/v1/tts/ws"
        ws = await websockets.connect(url)
        a = Client(ws)
        started = await a.start(voice="vivian", language="en", segments="utterance")
        await a.words(words)
        await a.send(type="text.end")
        await a.until("audio", timeout=120)  # its one segment is running
        ws.transport.abort()  # no close frame: a lost network
        deadline = time.monotonic() + 60
        while metric(server, "voxgate_ws_sessions_detached") < 1:  # the server has seen the drop
            assert time.monotonic() < deadline, "the server never saw the dropped socket"
            await asyncio.sleep(0.05)
        async with websockets.connect(url) as ws_b:
            b = Client(ws_b)
            await b.start(voice="ryan", language="en")
            await b.words("Somebody is listening now.")
            await b.send(type="text.end")
            b_done = await b.until("utterance.done", timeout=120)
        async with websockets.connect(url) as ws_a:
            again = Client(ws_a)
            resume = {"session_id": started["session_id"], "resume_token": started["resume_token"],
                      "last_unit_index_received": -1}  # fmt: skip
            resumed = await again.start(resume=resume)
            assert resumed["resumed"] is True
            a_done = await again.until("utterance.done", timeout=120)
        return [b_done], a.messages, [a_done, *again.messages]

    with ServerProcess("qwen3", env=env) as server:
        b_done, before, after = asyncio.run(run(server))
        stopped = sum(metric(server, f'voxgate_ws_segments_revoiced_total{{reason="{why}"}}')
                      for why in ("preempted", "parked"))  # fmt: skip
    assert b_done[0]["status"] == "completed"
    # A's stream gave its row up, stopped by the engine for B or by itself once its output was full
    # (which comes first depends on timing; that it could not have run to its end does not: it stops
    # reading a frame or two after the drop, and is held 4 s of frames on, well short of its end).
    assert stopped >= 1
    units = len(words.split())
    audio = [m for m in after if m["type"] == "audio"]
    assert audio and all((m["unit_start"], m["unit_end"]) == (0, units - 1) for m in audio)
    assert [(m["unit_start"], m["unit_end"]) for m in after if m["type"] == "units.done"] == [(0, units - 1)]
    assert after[0]["status"] == "completed"
    first_try = {m["seq"] for m in before if m["type"] == "audio"}
    assert first_try and not first_try & {m["seq"] for m in audio}  # none of the stopped attempt's audio again


def test_streams_that_open_on_the_event_loop_serve_http_and_sessions_and_refuse_typed(tiny_dirs):
    """`VOXGATE_QWEN3_TEXT_TABLE` on (what a GPU server does): the batched engine's streams open
    on the server's event loop (`Engine.opens_at_once`), not on a worker. HTTP and a WebSocket
    session are served, a text too long for the KV cache is refused typed at the open (413
    `text_too_long`), and no engine stream is left open."""
    import asyncio

    import websockets

    from tests.conftest import metric, wait_for
    from tests.integration.wsclient import Client

    env = {"QWEN3_MODEL_DIR": str(tiny_dirs["cv06"]), "STARTER_CACHE": "false", "QWEN3_BATCHED": "true",
           "QWEN3_TEXT_TABLE": "true", "QWEN3_KV_CAPACITY": "128", "QWEN3_MAX_STREAMS": "4"}  # fmt: skip
    body = {"voice": "vivian", "language": "en", "format": "pcm", "seed": 3}

    async def session(url: str) -> tuple[int, list[dict]]:
        async with websockets.connect(url.replace("http", "ws") + "/v1/tts/ws") as ws:
            c = Client(ws)
            await c.start(voice="vivian", language="en")
            await c.words("Opened on the loop. And a second sentence")
            await c.send(type="session.end")
            await c.until("session.done", timeout=120)
            return sum(m["samples"] for m in c.of("audio")), c.of("error")

    with ServerProcess("qwen3", env=env) as server:
        spoken = httpx.post(f"{server.url}/tts/stream", json={**body, "text": "Opened on the loop."}, timeout=120)
        assert spoken.status_code == 200 and len(spoken.content) > 0
        past_the_cache = " ".join(["word"] * 70)  # one engine piece (400 characters), past 128 positions
        refused = httpx.post(f"{server.url}/tts/stream", json={**body, "text": past_the_cache}, timeout=120)
        assert refused.status_code == 413 and refused.json()["error"]["code"] == "text_too_long"
        samples, errors = asyncio.run(session(server.url))
        assert samples > 0 and errors == []
        assert wait_for(lambda: metric(server, "voxgate_engine_streams_open") == 0, timeout=60)
