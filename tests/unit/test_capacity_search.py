"""The capacity search of `voxgate load --find-capacity`, against a stand-in server whose
capacity is known (the rounds' verdicts are computed from the reports `execute` returns)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from voxgate.bench.capacity import find_capacity, judge, overload
from voxgate.bench.load import LoadParams

PARAMS = LoadParams(url="ws://127.0.0.1:1/v1/tts/ws", concurrency=4)


def report(n: int, *, underruns: int = 0, p95: float | None = 400.0, refused: int = 0, waited: int = 0) -> dict:
    """A round's results; `waited` of the `underruns` came after the listener waited for text."""
    results = {
        "sessions": n, "sessions_ok": n - refused,
        "units": {"sent": 10 * n, "received": 10 * n, "missing": 0, "duplicate": 0, "mismatched": 0, "cancelled": 0},
        "underruns": {"count": underruns, "total_ms": 80.0 * underruns,
                      "after_text_wait": {"count": waited, "total_ms": 80.0 * waited},
                      "events": [{"session": i, "ms": 80.0, "at_s": 1.0 + i} for i in range(underruns)]},
        "ttfa_ms": {"all": {"p95": p95}}, "gateway_ttfa_ms": {"all": {"p95": 50.0}},
        "unit_latency_ms": {"all": {"p95": 900.0}}, "errors": {"other": {"busy": refused} if refused else {}},
    }  # fmt: skip
    return {"results": results}


def server_with_capacity(true_capacity: int, calls: list[int]):
    def execute(params: LoadParams) -> dict:
        n = params.concurrency
        calls.append(n)
        return report(n) if n <= true_capacity else report(n, underruns=n - true_capacity)

    return execute


@pytest.mark.parametrize("true_capacity", [4, 5, 37, 130, 999])
def test_the_search_brackets_the_true_capacity_within_ten_percent(true_capacity):
    calls: list[int] = []
    found = find_capacity(PARAMS, server_with_capacity(true_capacity, calls), limit=2000, progress=lambda _: None)
    low, high = found["capacity"], found["saturates_at"]
    assert low <= true_capacity < high and high - low <= max(1, low // 10)
    assert all(r["passed"] == (r["sessions"] <= true_capacity) for r in found["rounds"])
    assert len(calls) == len(set(calls)) and len(calls) <= 25  # no round run twice; a handful of rounds


def test_a_first_round_that_fails_says_no_capacity_and_a_limit_that_passes_says_so():
    found = find_capacity(PARAMS, server_with_capacity(2, []), limit=100, progress=lambda _: None)
    assert found["capacity"] is None and found["saturates_at"] == 4 and len(found["rounds"]) == 1
    found = find_capacity(PARAMS, server_with_capacity(500, []), limit=10, progress=lambda _: None)
    assert found["capacity"] == 10 and found["saturates_at"] is None
    assert [r["sessions"] for r in found["rounds"]] == [4, 6, 9, 10]


def test_a_round_fails_on_late_first_audio_refused_sessions_or_lost_units_not_only_underruns():
    assert judge(8, report(8)["results"], 1000)["passed"]
    late = judge(8, report(8, p95=1200.0)["results"], 1000)
    assert not late["passed"] and "first audio p95 1200.0 ms > 1000" in late["why_not"][0]
    busy = judge(8, report(8, refused=3)["results"], 1000)
    assert not busy["passed"] and "3 sessions failed" in busy["why_not"][0]
    assert judge(8, report(8, underruns=2)["results"], 1000, underrun_ms_max=160)["passed"]  # 2 x 80 ms allowed
    three = judge(8, report(8, underruns=3)["results"], 1000, underrun_ms_max=160)
    assert not three["passed"] and [e["session"] for e in three["underrun_events"]] == [0, 1, 2]  # where each fell
    lost = report(8)["results"]
    lost["units"]["missing"] = 1
    assert not judge(8, lost, 1000)["passed"]
    with pytest.raises(ValueError):
        find_capacity(PARAMS, server_with_capacity(4, []), limit=10, growth=1.0)


def test_overload_runs_the_crowd_then_a_fresh_probe_without_faults():
    seen: list[LoadParams] = []

    def execute(params: LoadParams) -> dict:
        seen.append(params)
        return report(params.concurrency, underruns=2 if params.concurrency > 10 else 0)

    crowd = replace(PARAMS, concurrency=64, scenario="overload", cancel=0.2)
    result = overload(crowd, execute, probe_sessions=3, probe_duration_s=5.0, ttfa_bound_ms=500)
    assert [p.concurrency for p in seen] == [64, 3] and seen[1].duration_s == 5.0 and seen[1].cancel == 0.0
    assert not result["crowd"]["passed"] and result["probe_after"]["passed"]


def test_a_round_keeps_its_longest_underruns_in_time_order():
    results = report(8, underruns=25)["results"]
    for i, event in enumerate(results["underruns"]["events"]):
        event["ms"] = float(i % 5 == 0) * 1000 + i  # the 5 at i = 0, 5, 10, 15, 20 are the longest
    kept = judge(8, results, 1000)["underrun_events"]
    assert len(kept) == 20 and [e["at_s"] for e in kept] == sorted(e["at_s"] for e in kept)
    assert {0, 5, 10, 15, 20} <= {e["session"] for e in kept} and 1 not in {e["session"] for e in kept}


def test_text_in_hand_fails_a_round_only_on_underruns_with_the_text_there():
    waits_only = report(8, underruns=3, waited=3)["results"]
    assert not judge(8, waits_only, 1000)["passed"]  # strict (the default): every underrun counts
    lenient = judge(8, waits_only, 1000, text_waits=False)
    assert (
        lenient["passed"] and lenient["underruns"] == 3 and lenient["underruns_after_text_wait"] == 3
    )  # still reported
    one_in_hand = judge(8, report(8, underruns=3, waited=2)["results"], 1000, text_waits=False)
    assert not one_in_hand["passed"] and "3 underruns (240.0 ms; 2 after" in one_in_hand["why_not"][0]
    assert judge(8, report(8, underruns=3, waited=2)["results"], 1000, underrun_ms_max=80, text_waits=False)["passed"]

    def execute(params: LoadParams) -> dict:  # past 20 sessions, only text waits
        n = params.concurrency
        return report(n, underruns=n // 10, waited=n // 10 if n <= 40 else 0)

    strict = find_capacity(PARAMS, execute, limit=100, progress=lambda _: None)
    found = find_capacity(PARAMS, execute, limit=100, text_waits=False, progress=lambda _: None)
    assert strict["capacity"] < 10 and 36 <= found["capacity"] <= 40 < found["saturates_at"]
    assert found["criteria"]["underruns_counted"].startswith("text in hand")
