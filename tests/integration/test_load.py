"""`voxgate load` against a real gateway (tone engine): every unit accounted for, with and
without injected faults."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from voxgate.bench.load import LoadParams, execute
from voxgate.bench.server import ServerProcess

# Backpressure the server can see quickly: the tone engine speaks 6 s per word (288 KB), the
# send-queue bound is tiny; a reader that stops for 5 s is dropped, one that reads is never
# stalled for 2 s. A resume replays whole segments, and a segment here (up to 12 words) is
# 3.5 MB of audio, so the replay buffer is raised above its 2 MiB default (enough for
# segments of ordinary speech).
FAULT_ENV = {"TONE_UNIT_MS": "6000", "WS_SEND_QUEUE_BYTES": "4096", "WS_BACKPRESSURE_WARN_S": "1.0",
             "WS_BACKPRESSURE_GRACE_S": "1.0", "WS_REPLAY_BYTES": str(16 << 20)}  # fmt: skip


def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/tts/ws"


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerProcess]:
    with ServerProcess("tone") as server:
        yield server


@pytest.fixture(scope="module")
def fault_gateway() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env=FAULT_ENV) as server:
        yield server


def test_baseline_receives_every_unit_exactly_once(gateway):
    admin = gateway.env["VOXGATE_ADMIN_KEYS"]
    params = LoadParams(url=ws_url(gateway), concurrency=4, cps=10, duration_s=4, admin_key=admin)
    report = execute(params)
    r = report["results"]
    server = r["server_first_audio"]  # the server's own split of each utterance's first audio
    assert server["utterance_first"]["segments"] == 4 and server["all"]["segments"] >= 4
    assert list(server["utterance_first"]) == ["segments", "queue", "slot", "engine", "hop", "write", "total"]
    assert server["note"] is None and admin not in json.dumps(report)
    assert r["units"] == {"sent": 160, "received": 160, "missing": 0, "duplicate": 0, "cancelled": 0, "mismatched": 0}
    assert r["sessions_ok"] == 4 and r["failures"] == {}
    assert r["errors"] == {"injected": {}, "other": {}}
    assert r["resumes"] == {"attempted": 0, "succeeded": 0}
    assert r["unit_latency_ms"]["all"]["n"] == 160 and r["ttfa_ms"]["all"]["n"] == 4
    assert r["audio_s"] == pytest.approx(160 * 0.12, abs=0.01)  # tone: 120 ms per word
    assert report["text"]["text_short"] is False


def test_mixed_faults_lose_nothing_and_every_resume_succeeds(fault_gateway):
    params = LoadParams(url=ws_url(fault_gateway), scenario="mixed", concurrency=4, cps=10, duration_s=8,
                        disconnect=0.5, cancel=0.5, backpressure=0.5, backpressure_pause_s=5.0,
                        reconnect_delay_s=0.2, seed=8)  # fmt: skip
    r = execute(params)["results"]
    assert r["injected"] == {"disconnect": 3, "cancel": 3, "backpressure": 4}  # the plan of seed 8
    u = r["units"]
    assert u["sent"] == 4 * 80 and u["missing"] == 0 and u["duplicate"] == 0, r
    assert u["mismatched"] == 0, r["mismatch_notes"]
    assert u["cancelled"] > 0 and u["received"] + u["cancelled"] == u["sent"]
    assert r["errors"]["other"] == {}, r["errors"]
    assert set(r["errors"]["injected"]) <= {"backpressure", "backpressure_drop"}
    assert r["backpressure_events"]["pauses"] == 4 and r["backpressure_events"]["drops"] > 0  # a silent reader dropped
    assert r["resumes"]["attempted"] >= 3 and r["resumes"]["succeeded"] == r["resumes"]["attempted"]
    assert r["sessions_ok"] == 4, r["failures"]


def test_many_utterances_per_socket_with_resumes_and_cancels_at_their_edges(gateway):
    """`--utterance-units 3`: an utterance ends every 3 words, so disconnects and cancels land
    on and around its edges; every unit is still accounted for and every resume succeeds."""
    params = LoadParams(url=ws_url(gateway), scenario="mixed", concurrency=6, cps=10, duration_s=4,
                        disconnect=0.5, cancel=0.5, backpressure=0.0, reconnect_delay_s=0.1,
                        utterance_units=3, seed=1)  # fmt: skip
    r = execute(params)["results"]
    u = r["units"]
    assert u["sent"] == 6 * 40 and u["missing"] == 0 and u["duplicate"] == 0 and u["mismatched"] == 0, r
    assert u["received"] + u["cancelled"] == u["sent"]
    assert r["sessions_ok"] == 6, r["failures"]
    assert r["errors"]["other"] == {}, r["errors"]
    assert r["resumes"]["attempted"] >= 1 and r["resumes"]["succeeded"] == r["resumes"]["attempted"]
    assert r["ttfa_ms"]["all"]["n"] >= 6 * 13  # 40 words: 14 utterances a session (more after a cancel)


def test_command_reports_a_short_text_and_writes_json(gateway, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("Just four words here.\n")
    out = tmp_path / "load.json"
    result = subprocess.run(
        [sys.executable, "-m", "voxgate", "load", "--url", ws_url(gateway), "--concurrency", "2", "--cps", "5",
         "--duration", "2", "--text-file", str(text), "--output-json", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning: the text has 4 units, fewer than cps x duration = 10" in result.stderr
    assert "| sessions ok |" in result.stdout
    report = json.loads(out.read_text())
    assert report["text"] == {**report["text"], "units": 4, "units_needed": 10, "text_short": True}
    assert report["results"]["units"]["sent"] == 8 and report["results"]["units"]["received"] == 8
    assert report["command"].startswith("voxgate load --url ws://")
    assert "403 Forbidden" in report["results"]["server_first_audio"]["unavailable"]  # no admin key: said
    assert "server stages: GET /debug/timings" in result.stdout


def test_the_report_says_when_the_servers_timings_ring_was_too_small_for_the_run():
    with ServerProcess("tone", env={"TIMINGS_KEPT": "3"}) as server:
        params = LoadParams(url=ws_url(server), concurrency=2, cps=10, duration_s=2,
                            admin_key=server.env["VOXGATE_ADMIN_KEYS"])  # fmt: skip
        server_side = execute(params)["results"]["server_first_audio"]
    assert "keeps 3 timings" in server_side["note"] and server_side["all"]["segments"] <= 3


def test_find_capacity_and_overload_from_the_command_line(gateway, tmp_path):
    """A tone server keeps up with a handful of sessions: every round passes up to the limit, and
    the overload scenario runs its crowd and then a fresh probe; both write their JSON."""
    out = tmp_path / "capacity.json"
    common = [
        sys.executable,
        "-m",
        "voxgate",
        "load",
        "--url",
        ws_url(gateway),
        "--cps",
        "10",
        "--duration",
        "1",
        "--ttfa-bound-ms",
        "60000",
        "--max-underrun-ms",
        "1e9",
    ]  # the plumbing, not this machine's speed
    found = subprocess.run([*common, "--concurrency", "1", "--find-capacity", "--capacity-max", "3",
                            "--underruns", "text-in-hand", "--output-json", str(out)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert found.returncode == 0, found.stderr
    capacity = json.loads(out.read_text())["capacity"]
    assert capacity["criteria"]["underruns_counted"].startswith("text in hand")
    assert [r["sessions"] for r in capacity["rounds"]] == [1, 2, 3] and capacity["capacity"] == 3
    assert capacity["saturates_at"] is None and "capacity: 3 sessions; saturates at not within 3" in found.stdout
    assert "[capacity] 2 sessions: pass" in found.stderr
    assert found.stderr.count("for an idle server") == 3  # each round waits until nothing is left running
    out = tmp_path / "overload.json"
    crowd = subprocess.run([*common, "--scenario", "overload", "--concurrency", "3", "--probe-sessions", "2",
                            "--probe-duration", "1", "--output-json", str(out)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert crowd.returncode == 0, crowd.stderr
    result = json.loads(out.read_text())["overload"]
    assert result["crowd"]["sessions"] == 3 and result["probe_after"]["sessions"] == 2
    assert result["probe_results"]["units"]["received"] == result["probe_results"]["units"]["sent"] > 0
    assert "probe right after (2 fresh sessions)" in crowd.stdout
