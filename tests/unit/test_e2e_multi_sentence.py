"""regress e2e, pure: multi-sentence cases (issue 20) — steps said sentence by sentence with
exact pauses, and the answered-once gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from voxgate.regress import signals
from voxgate.regress.e2e import judge, probe
from voxgate.regress.e2e.call import CallRecording, _turns_over
from voxgate.regress.e2e.cases import CaseError, load_cases, select
from voxgate.regress.e2e.runner import GATES_FILE
from voxgate.regress.e2e.speech import join_sentences
from voxgate.regress.gates import read_config

RATE = 22050


def voice(text: str) -> tuple[np.ndarray, int]:
    """A made-up voice: 100 ms of room tone, one tone burst per word, 150 ms of room tone (a
    TTS's own silence around a sentence, which joining must cut)."""
    t = np.arange(round(0.2 * RATE)) / RATE
    burst = 0.8 * np.sin(2 * np.pi * 180 * t) * np.hanning(len(t))
    gap = np.zeros(round(0.05 * RATE))
    words = np.concatenate([np.concatenate([burst, gap]) for _ in text.split()])[: -len(gap)]
    return np.concatenate([np.zeros(round(0.1 * RATE)), words, np.zeros(round(0.15 * RATE))]).astype(np.float32), RATE


def test_the_fast_tier_has_multi_sentence_cases_expecting_one_answer() -> None:
    multi = [c for c in select(load_cases(), "fast") if any(s.sentences for s in c.steps)]
    assert len(multi) >= 4 and all(c.priority == "P0" and c.expect.get("answered_once") for c in multi)
    for case in multi:
        step = case.steps[0]
        assert step.text == " ".join(step.sentences) and len(step.pauses_ms) == len(step.sentences) - 1
        assert all(300 <= p <= 900 for p in step.pauses_ms)


def test_a_step_whose_pauses_do_not_fit_its_sentences_is_refused(tmp_path: Path) -> None:
    bad = {"cases": [{"id": "m", "priority": "P0", "steps": [{"sentences": ["A.", "B?"], "pauses_ms": []}]}]}
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(CaseError, match="one pause between each two"):
        load_cases(path)


def test_joined_sentences_have_exactly_the_written_pauses() -> None:
    audio, rate, spans = join_sentences(voice, ["Okay.", "So, what is it?"], [600], lead_s=0.3)
    assert rate == RATE and spans[0][0] == pytest.approx(0.3, abs=0.011)
    assert spans[1][0] - spans[0][1] == pytest.approx(0.6, abs=0.011)  # the TTS's own 250 ms cut away
    speech = signals.speech_frames(audio, rate)
    pause = speech[round(spans[0][1] / signals.FRAME_S) + 1 : round(spans[1][0] / signals.FRAME_S) - 1]
    assert not pause.any()  # silence all through the pause
    assert len(audio) / rate == pytest.approx(spans[1][1], abs=1e-9)  # ends with the last word


@pytest.mark.parametrize(
    ("starts", "once"),
    [([2.5], True), ([1.2, 2.5], False), ([1.9], False), ([], False), ([2.5, 6.0], False)],
)
def test_answered_once_is_one_reply_after_the_last_word(starts: list[float], once: bool) -> None:
    assert judge.answered_once(starts, words_end=2.0) is once


def test_the_answered_once_gate_is_the_share_of_multi_cases_and_fails_below_target() -> None:
    cases = [judge.CaseResult("a", "P0", answered_once=True), judge.CaseResult("b", "P0", answered_once=False),
             judge.CaseResult("c", "P0"), judge.CaseResult("d", "P1", answered_once=False)]  # fmt: skip
    values, where = judge.gate_values(cases, [], None)
    assert values["multi_answered_once_rate"] == 0.5 and where["multi_answered_once_rate"] == "b"
    result = next(
        r for r in judge.judge(values, where, read_config(GATES_FILE)) if r.name == "multi_answered_once_rate"
    )
    assert result.status == "FAIL"
    values, where = judge.gate_values([judge.CaseResult("c", "P0")], [], None)
    assert values["multi_answered_once_rate"] is None  # no multi-sentence case ran: SKIP


def _cut_unheard_then_answered() -> CallRecording:
    """A reply started at the inner pause and cancelled before any audio went out (c-1), then
    the answer (c-2), heard; frames every 20 ms, loud while c-2 plays."""
    rec = CallRecording("multi_context", 1, call_id="c", record_rate=16000)
    loud, quiet = np.full(320, 0.2, np.float32), np.zeros(320, np.float32)
    rec.audio = [(0.02 * i, loud if 6.0 <= 0.02 * i < 7.0 else quiet) for i in range(500)]
    rec.events = [(1.0, {"type": "call.started"}), (3.0, {"type": "reply.start", "trace_id": "c-1"}),
                  (3.1, {"type": "turn.start", "trace_id": "c-2"}),
                  (4.0, {"type": "reply.end", "trace_id": "c-1", "status": "interrupted", "heard": ""}),
                  (5.5, {"type": "reply.start", "trace_id": "c-2"}),
                  (6.0, {"type": "reply.segment", "trace_id": "c-2", "index": 0}),
                  (7.2, {"type": "reply.end", "trace_id": "c-2", "status": "completed", "heard": "x"})]  # fmt: skip
    return rec


def test_a_reply_cut_before_any_audio_went_out_is_no_reply_and_its_turn_is_not_over() -> None:
    rec = _cut_unheard_then_answered()
    (take,) = probe.replies(rec)
    assert take.trace_id == "c-2" and take.status == "completed"

    class Bot:  # what the call waits on: the bot's events so far
        events = rec.events[:4]

    assert _turns_over(Bot()) == 0  # the unheard reply's end does not end the case's wait
    Bot.events = rec.events
    assert _turns_over(Bot()) == 1
