"""Start-up and shutdown as an operator sees them."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import metric, wait_for
from voxgate.bench.server import ServerError, ServerProcess


def test_not_ready_until_the_engine_is_loaded_and_warm():
    with ServerProcess("piper", wait_ready=False) as server:
        health = httpx.get(f"{server.url}/healthz")
        assert health.status_code == 503 and health.json()["status"] == "starting"
        early = httpx.post(f"{server.url}/tts/stream", json={"text": "too early"})
        assert early.status_code == 503 and early.json()["error"]["code"] == "not_ready"
        assert wait_for(lambda: httpx.get(f"{server.url}/healthz").status_code == 200, timeout=60)
        assert httpx.post(f"{server.url}/tts/stream", json={"text": "Now."}).status_code == 200


def test_serve_runs_on_uvloop_and_settles_its_heap_once_ready():
    with ServerProcess("tone") as server:
        assert wait_for(lambda: any("heap settled" in line for line in server.log), timeout=10)
        log = "\n".join(server.log)
        assert "loop=uvloop" in log
    with ServerProcess("tone", env={"GC_FREEZE": "false"}) as server:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        time.sleep(1.0)  # the heap is settled just after /healthz turns ready, when it is
        assert not any("heap settled" in line for line in server.log)


def test_failed_start_up_is_reported_and_the_server_exits():
    with pytest.raises(ServerError, match="piper voice file not found"):
        with ServerProcess("piper", env={"PIPER_MODEL": "/nonexistent/voice.onnx"}):
            pass


def test_a_client_that_stops_reading_is_dropped_and_its_slot_freed():
    env = {"SEND_TIMEOUT_S": "1", "TONE_UNIT_MS": "1000", "MAX_TEXT_CHARS": "20000"}
    with ServerProcess("tone", env=env) as server:
        text = " ".join(["a"] * 4000)  # 4000 s of audio, far more than the socket buffers hold
        with httpx.stream("POST", f"{server.url}/tts/stream", json={"text": text}, timeout=60) as r:
            pieces = r.iter_raw()  # kept referenced: a dropped iterator would close the connection
            next(pieces)  # read one piece, then stop reading
            assert wait_for(lambda: metric(server, 'voxgate_streams_cancelled_total{reason="send_timeout"}') == 1,
                            timeout=30)  # fmt: skip
            with pytest.raises(httpx.HTTPError):  # the body is cut short, never a clean end
                for _ in pieces:
                    pass
        assert wait_for(lambda: metric(server, "voxgate_active_streams") == 0, timeout=30)
        assert httpx.post(f"{server.url}/tts/stream", json={"text": "next client"}).status_code == 200
    assert wait_for(lambda: any("Finished server process" in line for line in server.log), timeout=30)  # all of it
    assert any("client stopped reading" in line for line in server.log)  # an expected drop: a warning,
    assert not [line for line in server.log if line.startswith("ERROR") or " ERROR " in line]  # not an error
