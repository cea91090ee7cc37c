"""regress e2e, pure: every gate passes on a good made-up call and fails, with the right
gate, on a recording made bad on purpose (silence inserted, clipping, a spike, a speed
change, a dropout, a low-pass, garbled audio, late or bursty frames, slow stages)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from voxgate.regress.e2e import inject, judge, metrics
from voxgate.regress.e2e.probe import Capture, ReplyTake, capture_status
from voxgate.regress.e2e.runner import GATES_FILE
from voxgate.regress.gates import read_config

RATE = 24000
CONFIG = read_config(GATES_FILE)
MARKS = {"vad_end": 0.0, "stt_done": 900.0, "llm_first_token": 1300.0, "tts_first_audio": 1500.0,
         "first_frame_published": 1510.0}  # fmt: skip


def speechlike(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """Syllables of random length and pitch (harmonics, with fricative hiss) between short
    pauses, peak 0.9 (Piper peaks at full scale): aperiodic, so windows can only line up in one place."""
    rng = np.random.default_rng(seed)
    pieces, total = [], 0
    while total < seconds * RATE:
        n = round(rng.uniform(0.1, 0.3) * RATE)
        t = np.arange(n) / RATE
        f0 = rng.uniform(100, 180)
        voiced = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 30) if f0 * k < 4000)
        hiss = np.diff(rng.standard_normal(n + 1)) * rng.uniform(0, 0.4)
        pieces += [(voiced + hiss) * np.hanning(n), np.zeros(round(rng.uniform(0.03, 0.15) * RATE))]
        total += n + len(pieces[-1])
    x = np.concatenate(pieces)[: round(seconds * RATE)]
    return (0.9 * x / np.max(np.abs(x))).astype(np.float32)


def take(post: np.ndarray, *, status: str = "completed", arrivals: np.ndarray | None = None,
         eot_ms: float = 2000.0, wait_s: float = 0.4) -> ReplyTake:  # fmt: skip
    """A reply heard as `post` (after `wait_s` of waiting), first audio at t=10 s."""
    wait = np.zeros(round(wait_s * RATE), dtype=np.float32)
    audio = np.concatenate([wait, post, np.zeros(RATE // 5, dtype=np.float32)])
    frames = len(audio) // 480
    times = arrivals if arrivals is not None else 9.6 + 0.02 * np.arange(frames)
    return ReplyTake("case", 1, 1, "call-1", status, 9.5, 9.6 + len(audio) / RATE, 10.0 - eot_ms / 1000, 10.0,
                     audio.astype(np.float32), times, RATE)  # fmt: skip


def run(post: np.ndarray, pre: np.ndarray | None = None, marks: dict | None = None, **kw) -> dict[str, str]:
    """Gate statuses of a one-reply P0 call."""
    reply = metrics.measure(take(post, **kw), "P0", None if pre is None else (pre, RATE), marks or MARKS)
    case = judge.CaseResult("case", "P0", attempts=1, audible=True)
    values, where = judge.gate_values([case], [reply], None)
    return {r.name: r.status for r in judge.judge(values, where, CONFIG)}


def failing(statuses: dict[str, str]) -> set[str]:
    return {name for name, status in statuses.items() if status == "FAIL"}


GOOD = speechlike()
HEARD = (GOOD + np.random.default_rng(1).normal(0, 1e-3, len(GOOD))).astype(np.float32)  # a codec's small error


def test_a_good_call_passes_every_gate_it_can_measure() -> None:
    statuses = run(HEARD, GOOD)
    assert failing(statuses) == set()
    assert statuses["mel_distance"] == statuses["added_gap"] == statuses["drift"] == "PASS"
    assert statuses["primary_kpi_regression"] == "SKIP"  # no baseline
    assert statuses["p1_input_fingerprints"] == "SKIP"  # no P1 case


@pytest.mark.parametrize("fault", sorted(inject.HEARD_FAULTS))
def test_each_heard_fault_fails_its_gate(fault: str) -> None:
    statuses = run(inject.HEARD_FAULTS[fault](HEARD, RATE), GOOD)
    assert inject.EXPECTED_GATE[fault] in failing(statuses), statuses


def test_silence_inserted_fails_the_gap_gates_with_and_without_the_engine_capture() -> None:
    broken = inject.faults.insert_silence(HEARD, RATE, seconds=1.5)
    assert {"max_gap", "added_gap"} <= failing(run(broken, GOOD))
    assert "max_gap" in failing(run(broken, None))  # PRE_MISSING: transport ring only


def test_a_long_wait_before_the_reply_still_lines_up() -> None:
    reply = metrics.measure(take(HEARD, wait_s=3.5), "P0", (GOOD, RATE), MARKS)
    assert reply.mel_distance_db is not None and reply.mel_distance_db < 1.0 and reply.added_gap_ms == 0.0


def test_garbled_audio_fails_the_mel_distance() -> None:
    garbled = HEARD.copy()
    garbled[RATE : 2 * RATE] = np.random.default_rng(2).normal(0, 0.1, RATE)
    assert "mel_distance" in failing(run(garbled, GOOD))


def test_bursty_frames_fail_inter_arrival() -> None:
    frames = (len(HEARD) + round(0.6 * RATE)) // 480
    bursty = 9.6 + 0.2 * (np.arange(frames) // 10)  # ten frames at once every 200 ms
    assert "inter_arrival_p95" in failing(run(HEARD, GOOD, arrivals=bursty))
    assert "inter_arrival_p95" not in failing(run(HEARD, GOOD))


def test_latency_gates_fail_on_slow_stages_and_pass_on_fast_ones() -> None:
    assert "eot_to_first_audio_p95" in failing(run(HEARD, GOOD, eot_ms=12000))
    slow = {**MARKS, "llm_first_token": 4000.0, "first_frame_published": 1560.0}
    assert {"llm_ttft_p95", "tts_first_to_publish_p95"} <= failing(run(HEARD, GOOD, marks=slow))


def test_audio_held_on_purpose_is_not_the_tracks_delay() -> None:
    """The controller held the reply's audio (the minimum gap after the user's voice) and released
    it at 1550 ms: the track's own delay counts from there, not from the engine's first audio."""
    held = {**MARKS, "audio_released": 1550.0, "first_frame_published": 1560.0}
    assert metrics.measure(take(HEARD), "P0", (GOOD, RATE), held).tts_first_to_publish_ms == 10.0
    early = {**MARKS, "audio_released": 1400.0}  # released before the first audio: no difference
    assert metrics.measure(take(HEARD), "P0", (GOOD, RATE), early).tts_first_to_publish_ms == 10.0


def test_primary_kpi_fails_on_a_regression_over_30_ms_only() -> None:
    reply = metrics.measure(take(HEARD, eot_ms=2000), "P0", (GOOD, RATE), MARKS)
    case = judge.CaseResult("case", "P0", attempts=1, audible=True)
    for baseline, expected in ((1969.0, "FAIL"), (1971.0, "PASS")):
        values, where = judge.gate_values([case], [reply], baseline)
        result = next(r for r in judge.judge(values, where, CONFIG) if r.name == "primary_kpi_regression")
        assert result.status == expected, (baseline, result)


def test_capture_status_classes() -> None:
    silent = np.zeros_like(HEARD)
    assert capture_status(take(HEARD), GOOD) is Capture.OK
    assert capture_status(take(silent), GOOD) is Capture.POST_SILENT
    assert capture_status(take(HEARD), None) is Capture.PRE_MISSING
    assert capture_status(take(silent), None) is Capture.BOTH_MISSING
    assert capture_status(take(silent, status="interrupted"), None) is Capture.CUT_SILENT


def test_a_silent_reply_is_measured_only_where_it_means_something() -> None:
    reply = metrics.measure(take(np.zeros_like(HEARD)), "P0", (GOOD, RATE), MARKS)
    assert reply.capture == "POST_SILENT" and reply.max_gap_ms is None and reply.mel_distance_db is None
    assert reply.tts_first_to_publish_ms == 10.0  # latency still comes from the trace


def test_a_cut_reply_is_compared_only_as_far_as_it_was_heard() -> None:
    heard = HEARD[: len(HEARD) // 2]
    reply = metrics.measure(take(heard, status="interrupted"), "P0", (GOOD, RATE), MARKS)
    assert reply.mel_distance_db is not None and reply.mel_distance_db < 1.5
    assert reply.drift_ratio is None  # a cut reply has no pace to compare


def _case_gates(cases: list[judge.CaseResult]) -> dict[str, str]:
    values, where = judge.gate_values(cases, [], None)
    return {r.name: r.status for r in judge.judge(values, where, CONFIG)}


def test_case_level_gates_both_ways() -> None:
    good = judge.CaseResult("a", "P0", attempts=1, audible=True)
    assert _case_gates([good])["audio_valid_rate"] == "PASS"
    assert _case_gates([good, dataclasses.replace(good, case_id="b", audible=False)])["audio_valid_rate"] == "FAIL"
    missed = dataclasses.replace(good, problems=["the barge-in did not cut the first reply"])
    assert _case_gates([missed])["case_expectations"] == "FAIL"
    retried = dataclasses.replace(good, attempts=2)
    assert _case_gates([retried])["retry_rate"] == "WARN"  # reported, does not fail the run
    shown = judge.CaseResult("p", "P1", attempts=1, audible=True, fingerprint={"ok": True})
    assert _case_gates([shown])["p1_input_fingerprints"] == "PASS"
    assert _case_gates([dataclasses.replace(shown, fingerprint={"ok": False})])["p1_input_fingerprints"] == "FAIL"
    assert _case_gates([dataclasses.replace(shown, audible=False)])["p1_audio_valid_rate"] == "WARN"


def test_expectations_name_what_the_call_did_wrong() -> None:
    from voxgate.regress.e2e.cases import Case, Step

    case = Case("i", "P0", (Step("a"), Step("b", "over_reply")), expect={"replies": 2, "first_cut": True})
    assert judge.expectation_problems(case, ["interrupted", "completed"], []) == []
    problems = judge.expectation_problems(case, ["completed"], ["backchannel"])
    assert problems == ["1 of 2 replies (turns dropped: backchannel)", "the barge-in did not cut the first reply"]
    assert judge.expectation_problems(case, ["interrupted", None], []) == ["a reply never ended"]


def test_trace_marks_come_from_turn_trace_events_else_from_the_agents_jsonl() -> None:
    rows = [{"trace_id": "c-1", "marks": {"vad_end": 100.0, "stt_done": 100.9, "llm_first_token": 101.2}},
            {"trace_id": "c-2", "marks": {"vad_end": 200.0, "stt_done": 200.5}}]  # fmt: skip
    events = [(0.0, {"type": "turn.trace", "trace_id": "c-2", "marks": {"vad_end": 0.0, "stt_done": 480.0}})]
    marks = metrics.trace_marks(events, rows)
    assert marks["c-1"] == pytest.approx({"vad_end": 0.0, "stt_done": 900.0, "llm_first_token": 1200.0})
    assert marks["c-2"] == {"vad_end": 0.0, "stt_done": 480.0}  # the event (ms from vad_end) wins
