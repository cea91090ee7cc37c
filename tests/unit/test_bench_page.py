"""`voxgate bench page`'s checks (the browser test's criteria, also the GPU machine's verdict):
a good call passes every one, and each breakage fails its own check and no other."""

from __future__ import annotations

import copy

import pytest

from voxgate.bench.page import CHECKS, checks


def good_run() -> dict:
    return {
        "url": "http://127.0.0.1:8765", "page_errors": [], "failed": None, "ms": {"connect": 900, "reply": 7000},
        "button_before": "Start call", "call_id": "c1", "button_in_call": "Hang up",
        "user_text": "What is the capital of friends?",
        "reply_end": {"type": "reply.end", "status": "completed", "heard": "Paris is the capital."},
        "agent_text": "Paris is the capital.",
        "audio": {"energy": 0.02, "bytes": 96000, "peak": 0.4},
        "eot_ms": [612], "figures": {"p50": "612 ms", "p95": "612 ms"},
        "breakdown": {"hangover": "200 ms", "stt": "80 ms", "llm": "150 ms", "tts": "90 ms", "eot": "612 ms"},
        "button_after": "Start call",
        "server_after_hang_up": {"status": 404, "body": {"error": {"code": "not_found"}}},
    }  # fmt: skip


def test_a_good_call_passes_every_check():
    assert checks(good_run()) == dict.fromkeys(CHECKS, True)


BREAKAGES = {
    "connected": lambda r: r.update(button_in_call="Start call"),
    "transcript_shown": lambda r: r.update(user_text="what is the weather"),
    "reply_completed": lambda r: r["reply_end"].update(status="interrupted"),
    "reply_text_shown": lambda r: r.update(agent_text="Paris is"),
    "reply_audio_played": lambda r: r["audio"].update(energy=0.0),
    "latency_shown": lambda r: r["breakdown"].update(stt="-"),
    "hung_up": lambda r: r.update(server_after_hang_up={"status": 200, "body": {}}),
    "no_page_errors": lambda r: r["page_errors"].append("TypeError: x is undefined"),
}


@pytest.mark.parametrize("name", BREAKAGES)
def test_each_breakage_fails_its_check_and_no_other(name):
    run = copy.deepcopy(good_run())
    BREAKAGES[name](run)
    assert checks(run) == {check: check != name for check in CHECKS}


def test_a_call_that_stopped_at_a_step_fails_what_it_did_not_reach():
    run = good_run()
    for key in ("user_text", "reply_end", "agent_text", "audio", "eot_ms", "figures", "breakdown", "button_after"):
        del run[key]
    del run["server_after_hang_up"]
    run["failed"] = "reply: TimeoutError: Timeout 120000ms exceeded."
    verdict = checks(run)
    assert verdict == {check: check == "connected" for check in CHECKS}
