"""`voxgate load` without sockets: parameters, text plan, fault plan, and the exact per-unit
accounting of the session ledger (scripted server messages in, tallies out)."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.bench.load import (
    DEFAULT_TEXT,
    LoadParams,
    _command,
    add_arguments,
    params_from_args,
    plan_faults,
    plan_text,
    short_text_warning,
    unit_deltas,
)
from voxgate.bench.load_stats import SessionLedger, UnitTally, markdown_table, summarize, windowed_ms
from voxgate.text import count_units
from voxgate.types import InvalidRequest


def parse(*argv: str) -> LoadParams:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return params_from_args(parser.parse_args(list(argv)))


def audio(seq: int, start: int, end: int, utterance: int = 0, samples: int = 100) -> dict:
    return {"type": "audio", "seq": seq, "utterance": utterance, "unit_start": start, "unit_end": end,
            "samples": samples, "bytes": 2 * samples}  # fmt: skip


def ledger_with_sent(n: int, every: float = 0.1) -> SessionLedger:
    ledger = SessionLedger()
    ledger.sample_rate = 1000
    for i in range(n):
        ledger.sent(i, i * every)
    return ledger


def speak(ledger: SessionLedger, seq: int, start: int, end: int, t: float, utterance: int = 0) -> None:
    """One segment as the server sends it: one audio message, then units.done."""
    ledger.audio(audio(seq, start, end, utterance), 200, t)
    ledger.units_done(utterance, start, end)


# ---------------------------------------------------------------------------- parameters


def test_baseline_forces_every_fault_fraction_to_zero():
    p = parse("--scenario", "baseline", "--disconnect-percent", "0.5", "--cancel-percent", "0.3")
    assert (p.disconnect, p.cancel, p.backpressure) == (0.0, 0.0, 0.0)


def test_mixed_defaults_to_ten_percent_each_unless_given():
    p = parse("--scenario", "mixed", "--cancel-percent", "0.4")
    assert (p.disconnect, p.cancel, p.backpressure) == (0.1, 0.4, 0.1)
    assert (p.backpressure_pause_s, p.reconnect_delay_s, p.units) == (10.0, 1.0, "words")
    assert p.utterance_units == 0  # the whole text is one utterance


@pytest.mark.parametrize("flags", [("--disconnect-percent", "10"), ("--cancel-percent", "-0.1"),
                                   ("--concurrency", "0"), ("--url", "http://x/v1/tts/ws"),
                                   ("--utterance-units", "-1")])  # fmt: skip
def test_impossible_parameters_are_refused(flags):
    with pytest.raises(InvalidRequest):
        parse("--scenario", "mixed", *flags)


# ---------------------------------------------------------------------------- text


def test_word_deltas_hold_one_unit_each_and_rebuild_the_text():
    text = "Hello, world!  Two  spaces. 你好。End"
    deltas = unit_deltas(text, "words")
    assert all(count_units(d) == 1 for d in deltas)
    assert "".join(deltas) == text
    assert deltas[:3] == ["Hello, ", "world!  ", "Two  "]


def test_char_deltas_hold_one_non_space_character_each():
    assert unit_deltas("ab c", "chars") == ["a", "b ", "c"]


def test_a_short_text_is_reported_and_never_padded():
    plan = plan_text("One two three.", "words", cps=5, duration_s=2)
    assert plan.short and plan.available == 3 and plan.needed == 10
    assert plan.deltas == ("One ", "two ", "three.")
    warning = short_text_warning(plan, cps=5)
    assert warning is not None and "3 units" in warning and "= 10" in warning


def test_a_long_text_is_cut_to_cps_times_duration():
    plan = plan_text(DEFAULT_TEXT, "words", cps=5, duration_s=60)
    assert not plan.short and len(plan.deltas) == 300 and short_text_warning(plan, 5) is None
    assert DEFAULT_TEXT.rstrip().endswith(".") and plan.available >= 300


# ---------------------------------------------------------------------------- fault plan


def test_fault_plan_is_reproducible_from_the_seed():
    params = LoadParams(url="ws://x", concurrency=50, disconnect=0.3, cancel=0.3, backpressure=0.3, seed=7)
    assert plan_faults(params, 60) == plan_faults(params, 60)
    other = LoadParams(url="ws://x", concurrency=50, disconnect=0.3, cancel=0.3, backpressure=0.3, seed=8)
    assert plan_faults(params, 60) != plan_faults(other, 60)


def test_fault_fractions_and_times_follow_the_parameters():
    params = LoadParams(url="ws://x", concurrency=2000, disconnect=0.1, cancel=0.5, backpressure=0.0,
                        backpressure_pause_s=10)  # fmt: skip
    plans = plan_faults(params, 60)
    assert 150 < sum(p.disconnect_at is not None for p in plans) < 250
    assert 900 < sum(p.cancel_at is not None for p in plans) < 1100
    assert all(p.backpressure_at is None for p in plans)
    times = [t for p in plans for t, _ in p.events()]
    assert min(times) >= 15 and max(times) <= 36  # the middle of a 60 s run


def test_a_backpressure_pause_ends_before_the_text_does():
    params = LoadParams(url="ws://x", concurrency=200, backpressure=1.0, backpressure_pause_s=5)
    assert max(p.backpressure_at or 0 for p in plan_faults(params, 8)) <= 3.0


def test_baseline_plans_no_fault():
    params = LoadParams(url="ws://x", concurrency=100)
    assert all(p.events() == [] for p in plan_faults(params, 60))


# ---------------------------------------------------------------------------- ledger


def test_every_unit_spoken_once_is_received():
    ledger = ledger_with_sent(6)
    speak(ledger, 0, 0, 2, 0.5)
    speak(ledger, 1, 3, 5, 0.9)
    ledger.utterance_done(0, "completed", 5)
    assert ledger.tally() == UnitTally(sent=6, received=6, missing=0, duplicate=0, cancelled=0, mismatched=0)
    assert ledger.audio_s == pytest.approx(0.2)


def test_unspoken_units_are_missing_and_repeated_ones_duplicate():
    ledger = ledger_with_sent(6)
    speak(ledger, 0, 0, 2, 0.5)
    ledger.units_done(0, 0, 2)  # the same segment reported twice
    tally = ledger.tally()
    assert (tally.received, tally.duplicate, tally.missing) == (0, 3, 3)


def test_ranges_over_units_never_sent_are_mismatches():
    ledger = ledger_with_sent(3)
    ledger.units_done(0, 2, 4)
    ledger.audio(audio(0, 5, 6), 200, 1.0)
    assert ledger.mismatches == 2 and ledger.tally().received == 0


@pytest.mark.parametrize("seqs", [(0, 2), (0, 1, 1), (1,)])
def test_audio_seq_gaps_and_repeats_are_mismatches(seqs):
    ledger = ledger_with_sent(3)
    for seq in seqs:
        ledger.audio(audio(seq, 0, 2), 200, 1.0)
    assert ledger.mismatches == 1


def test_a_frame_of_another_size_than_its_header_is_a_mismatch():
    ledger = ledger_with_sent(1)
    ledger.audio(audio(0, 0, 0), 199, 1.0)
    assert ledger.mismatches == 1


def test_resume_point_is_the_last_units_done_and_the_replay_is_expected():
    ledger = ledger_with_sent(9)
    speak(ledger, 0, 0, 2, 0.5)
    ledger.audio(audio(1, 3, 5), 200, 0.8)  # units.done for 3..5 lost with the socket
    ledger.audio(audio(2, 6, 8), 200, 0.9)
    assert ledger.disconnected() == 2
    speak(ledger, 1, 3, 5, 1.5)  # replayed with the original seq numbers
    speak(ledger, 2, 6, 8, 1.6)
    assert ledger.tally() == UnitTally(sent=9, received=9, missing=0, duplicate=0, cancelled=0, mismatched=0)
    assert ledger.first_audio_at[3] == 0.8  # latency counts the first arrival, not the replay
    assert ledger.audio_s == pytest.approx(0.3) and ledger.discarded_samples == 200


def test_after_a_disconnect_a_segment_voiced_again_may_skip_seq_numbers_once():
    """A segment stopped while nobody listened comes again with new `seq` numbers
    (docs/protocol.md): after a resume, the first audio of a segment not done before the drop
    may skip forward; a skip inside a segment, or before any disconnect (the parametrized test
    above), is still a mismatch."""
    ledger = ledger_with_sent(9)
    speak(ledger, 0, 0, 2, 0.5)
    ledger.audio(audio(1, 3, 5), 200, 0.8)  # its start heard, then the socket was lost
    assert ledger.disconnected() == 2
    ledger.audio(audio(4, 3, 5), 200, 1.5)  # voiced again: seq 1..3 are gone for good
    ledger.audio(audio(6, 3, 5), 200, 1.6)  # a skip inside the segment: a loss
    ledger.units_done(0, 3, 5)
    assert ledger.mismatches == 1 and ledger.tally().received == 6


def test_after_a_disconnect_a_skip_at_a_segment_sent_later_is_still_a_loss():
    ledger = ledger_with_sent(6)
    speak(ledger, 0, 0, 2, 0.5)
    assert ledger.disconnected() == 2  # units 6.. are sent after the drop: their segments are voiced once
    for i in range(6, 12):
        ledger.sent(i, 1.0)
    ledger.audio(audio(1, 3, 5), 200, 1.0)
    ledger.audio(audio(2, 3, 5), 200, 1.1)  # seq 3, this segment's last audio, is lost
    ledger.units_done(0, 3, 5)
    ledger.audio(audio(4, 6, 8), 200, 1.5)  # the next segment's first audio skips it
    ledger.units_done(0, 6, 8)
    assert ledger.mismatches == 1


def test_a_replay_of_what_was_already_done_is_caught():
    ledger = ledger_with_sent(6)
    speak(ledger, 0, 0, 2, 0.5)
    speak(ledger, 1, 3, 5, 0.6)
    ledger.disconnected()
    speak(ledger, 1, 3, 5, 1.5)  # the server resent a segment the client had confirmed
    tally = ledger.tally()
    assert tally.duplicate == 3 and tally.mismatched == 1


def test_cancelled_units_are_not_missing_and_the_next_utterance_goes_on():
    ledger = ledger_with_sent(4)
    speak(ledger, 0, 0, 1, 0.3)
    ledger.audio(audio(1, 2, 3), 200, 0.4)  # audio seq 2, 3 of this segment are dropped by the cancel
    ledger.cancel_sent(next_unit=4)
    ledger.utterance_done(0, "cancelled", 3)
    for i in range(4, 6):
        ledger.sent(i, 0.5)
    speak(ledger, 4, 4, 5, 0.9, utterance=1)  # past the hole the cancel left in seq
    ledger.utterance_done(1, "completed", 5)
    assert ledger.tally() == UnitTally(sent=6, received=4, missing=0, duplicate=0, cancelled=2, mismatched=0)


def test_an_utterance_with_an_unexpected_status_is_a_mismatch():
    ledger = ledger_with_sent(2)
    ledger.utterance_done(0, "cancelled", 1)  # never cancelled by this client
    ledger.utterance_done(3, "completed", 1)  # never started
    assert ledger.mismatches == 2


def test_audio_outside_its_utterance_is_a_mismatch():
    ledger = ledger_with_sent(4)
    ledger.cancel_sent(next_unit=2)
    ledger.audio(audio(0, 1, 2), 200, 0.5)  # spans the boundary of utterances 0 and 1
    assert ledger.mismatches == 1


def test_errors_count_as_injected_only_after_their_fault():
    ledger = SessionLedger()
    ledger.error("backpressure")
    ledger.injected.add("backpressure")
    ledger.error("backpressure")
    ledger.error("engine_error")
    assert ledger.errors_other == {"backpressure": 1, "engine_error": 1}
    assert ledger.errors_injected == {"backpressure": 1}


@settings(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # pure: time is no part of it
@given(st.integers(1, 40), st.lists(st.tuples(st.integers(0, 45), st.integers(0, 5)), max_size=12))
def test_the_tally_partitions_the_sent_units(sent, ranges):
    ledger = ledger_with_sent(sent)
    for start, length in ranges:
        ledger.units_done(0, start, start + length)
    t = ledger.tally()
    assert t.received + t.duplicate + t.missing + t.cancelled == t.sent == sent
    covered = {i for s, n in ranges if s + n < sent for i in range(s, s + n + 1)}
    assert t.received + t.duplicate == len(covered)


# ---------------------------------------------------------------------------- latency and report


def test_unit_latency_and_ttfa_run_from_the_send_time():
    ledger = ledger_with_sent(4, every=0.5)  # sent at 0, 0.5, 1.0, 1.5
    speak(ledger, 0, 0, 1, 0.7)
    speak(ledger, 1, 2, 3, 1.9)
    rows = ledger.unit_latencies()
    assert [t for t, _ in rows] == [0.0, 0.5, 1.0, 1.5]
    assert [latency for _, latency in rows] == pytest.approx([0.7, 0.2, 0.9, 0.4])
    assert ledger.ttfas() == [(0.0, 0.7)]
    assert ledger.gateway_ttfas() == [(0.5, pytest.approx(0.2))]  # from unit 1, which completed the segment


def test_drift_windows_split_by_send_time():
    samples = [(t, 0.1) for t in range(10)] + [(t, 0.5) for t in range(50, 60)] + [(30, 9.0)]
    out = windowed_ms(samples, span_s=60, window_s=10)
    assert out["first"]["n"] == 10 and out["first"]["p99"] == 100.0
    assert out["last"]["n"] == 10 and out["last"]["p50"] == 500.0
    assert out["all"]["n"] == 21 and out["all"]["max"] == 9000.0


def test_summary_adds_up_sessions_and_marks_unclean_ones():
    good, bad = ledger_with_sent(3), ledger_with_sent(3)
    speak(good, 0, 0, 2, 0.4)
    good.utterance_done(0, "completed", 2)
    good.finished = True
    bad.failure = "resume_failed_resume_not_available"
    results = summarize([good, bad], sending_s=0.3)
    assert results["units"] == {"sent": 6, "received": 3, "missing": 3, "duplicate": 0, "cancelled": 0,
                                "mismatched": 0}  # fmt: skip
    assert (results["sessions_ok"], results["session_errors"]) == (1, 1)
    assert results["failures"] == {"resume_failed_resume_not_available": 1}
    assert results["backpressure_events"] == {"pauses": 0, "server_warnings": 0, "drops": 0}
    table = markdown_table(results)
    assert "| 1/2 | 6 | 3 | 3 | 0 | 0 | 0 |" in table and "unit_latency" in table


def _audio(ledger: SessionLedger, seq: int, start: int, end: int, seconds: float, t: float) -> None:
    samples = int(seconds * ledger.sample_rate)
    header = {
        "seq": seq,
        "utterance": 0,
        "unit_start": start,
        "unit_end": end,
        "samples": samples,
        "bytes": 2 * samples,
    }
    ledger.audio(header, 2 * samples, t)


def test_the_listener_counts_only_silence_the_server_caused():
    ledger = SessionLedger()
    ledger.sample_rate = 1000
    for i, t in enumerate([0.0, 0.1, 0.2, 1.0, 1.1, 1.2]):
        ledger.sent(i, t)
    _audio(ledger, 0, 0, 2, 0.5, 0.3)  # plays 0.3..0.8
    _audio(ledger, 1, 0, 2, 0.5, 0.7)  # arrives before the buffer is dry: plays 0.8..1.3
    _audio(ledger, 2, 3, 5, 0.5, 1.5)  # dry at 1.3, its text (unit 5) sent at 1.2: 0.2 s underrun
    assert ledger.underruns == pytest.approx([0.2])
    slow = SessionLedger()
    slow.sample_rate = 1000
    for i, t in enumerate([0.0, 0.1, 0.2, 2.0, 2.1, 2.2]):
        slow.sent(i, t)
    _audio(slow, 0, 0, 2, 0.5, 0.3)  # dry at 0.8, but the next text came at 2.2
    _audio(slow, 1, 3, 5, 0.5, 2.3)  # 0.1 s after its text: that much is the server's
    assert slow.underruns == pytest.approx([0.1])
    report = summarize([ledger, slow], sending_s=3.0)["underruns"]
    assert report["count"] == 2 and report["sessions_with"] == 2 and report["total_ms"] == pytest.approx(300.0)
    assert [s["count"] for s in report["per_session"]] == [1, 1]
    # the slow session's listener had been dry 1.4 s (0.8 -> 2.2) when its text came: counted apart too
    assert report["after_text_wait"] == {"count": 1, "total_ms": pytest.approx(100.0)}
    # one by one, in time order from the run's first audio (0.3), each after its utterance's first audio
    got = [(e["session"], e["ms"], e["at_s"], e["after_first_audio_ms"], e["seq"], e["text_wait_ms"])
           for e in report["events"]]  # fmt: skip
    assert got == [
        (0, pytest.approx(200.0), pytest.approx(1.2), pytest.approx(1200.0), 2, 0.0),
        (1, pytest.approx(100.0), pytest.approx(2.0), pytest.approx(2000.0), 1, pytest.approx(1400.0)),
    ]


def test_the_reported_command_line_hides_both_keys(monkeypatch):
    argv = ["voxgate", "load", "--api-key", "sk-client-1", "--admin-key", "sk-admin-2", "--concurrency", "4"]
    monkeypatch.setattr("sys.argv", argv)
    params = LoadParams(url="ws://x", api_key="sk-client-1", admin_key="sk-admin-2")
    command = _command(params)
    assert "sk-client-1" not in command and "sk-admin-2" not in command
    assert command == "voxgate load --api-key *** --admin-key *** --concurrency 4"
