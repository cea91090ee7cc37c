"""The multi-sentence bench's judgement (voxgate/bench/answers.py) on synthetic calls, and the
question set's loading rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from voxgate.bench.answers import Asked, gaps, outcome, summarise, table, word_recall
from voxgate.bench.questions import FOLLOWUP_FILE, PAUSE_RANGE_MS, QuestionSetError, load_questions

SAID = 100.0  # the question's last word (bot clock)


def _asked(*events: tuple[float, str], first_audio: float | None = None, sentences: int = 2, qid: str = "q") -> Asked:
    """A call with events at SAID + offset; reply.start events carry trace ids r1, r2, ..."""
    out: list[tuple[float, dict[str, Any]]] = []
    for offset, kind in events:
        event: dict[str, Any] = {"type": kind}
        if kind == "reply.start":
            event["trace_id"] = f"r{sum(e['type'] == 'reply.start' for _, e in out) + 1}"
        out.append((SAID + offset, event))
    audio = None if first_audio is None else SAID + first_audio
    return Asked(qid, "opener", "piper", "Hi there. What is the tallest mountain?", sentences, SAID, tuple(out), audio)


def test_end_at_inner_pause_merged_into_one_reply_is_premature_but_answered_once() -> None:
    o = outcome(
        _asked((-2.0, "turn.start"), (-1.5, "turn.end"), (0.3, "turn.end"), (1.2, "reply.start"), first_audio=2.0)
    )
    assert (o.premature, o.answered_once, o.stuck, o.replies) == (True, True, False, 1)
    assert o.trace_id == "r1" and o.last_word_to_first_audio_ms == 2000.0


def test_reply_started_at_inner_pause_then_the_real_answer_is_answered_twice() -> None:
    o = outcome(_asked((-1.5, "turn.end"), (-0.4, "reply.start"), (0.0, "reply.end"), (1.5, "reply.start")))
    assert (o.premature, o.answered_once, o.replies) == (True, False, 2)
    assert o.trace_id == "r2"  # the final reply is the one timed


def test_one_end_after_the_last_word_is_a_clean_answer() -> None:
    o = outcome(_asked((-3.0, "turn.start"), (0.25, "turn.end"), (1.0, "reply.start")))
    assert (o.premature, o.answered_once, o.stuck) == (False, True, False)


def test_a_reply_cancelled_before_any_of_its_audio_went_out_was_not_heard() -> None:
    """Started at the inner pause, held while the user went on, cancelled unheard: the user
    heard one answer, to the whole question (the early start still counts as premature)."""
    o = outcome(_asked((-1.5, "turn.end"), (-0.4, "reply.start"), (0.0, "reply.end"), (1.5, "reply.start")),
                unheard=frozenset({"r1"}))  # fmt: skip
    assert (o.replies, o.unheard, o.answered_once, o.premature) == (1, 1, True, True)
    heard = outcome(_asked((-1.5, "turn.end"), (-0.4, "reply.start"), (0.0, "reply.end"), (1.5, "reply.start")))
    assert (heard.replies, heard.unheard, heard.answered_once) == (2, 0, False)


def test_a_reply_that_alone_started_before_the_last_word_is_not_answered_once() -> None:
    o = outcome(_asked((-0.5, "turn.end"), (-0.1, "reply.start")))
    assert (o.premature, o.answered_once, o.stuck, o.replies) == (True, False, False, 1)


def test_no_reply_within_the_bound_is_stuck() -> None:
    assert outcome(_asked((0.3, "turn.end"), (0.9, "turn.dropped"))).stuck
    late = outcome(_asked((0.3, "turn.end"), (25.0, "reply.start")), stuck_s=20.0)
    assert late.stuck and not late.answered_once


def test_summary_rates_per_group_and_breakdown_from_the_final_reply_trace() -> None:
    asked = [
        _asked((-1.5, "turn.end"), (0.2, "turn.end"), (1.0, "reply.start"), qid="a"),
        _asked((-1.5, "turn.end"), (-0.4, "reply.start"), (1.5, "reply.start"), qid="b"),
        _asked((0.2, "turn.end"), qid="c"),
        _asked((0.2, "turn.end"), (1.0, "reply.start"), sentences=1, qid="d"),
    ]
    traces = [
        {"trace_id": "r1", "user": "Hi there. What is the tallest mountain?",
         "marks": {"vad_end": 100.2, "stt_done": 100.9, "first_frame_published": 101.7}},
        {"trace_id": "r2", "user": "What is the tallest mountain?",
         "marks": {"vad_end": 100.3, "stt_done": 101.3, "first_frame_published": 102.3}},
    ]  # fmt: skip
    s = summarise(asked, traces, same_host=True)
    assert s["multi"] == {"questions": 3, "answered_once_rate": 0.333, "premature_eot_rate": 0.667, "stuck": 1,
                          "replies": {"0": 1, "1": 1, "2": 1}, "unheard_replies": 0}  # fmt: skip
    assert s["single"]["answered_once_rate"] == 1.0 and s["single"]["premature_eot_rate"] == 0.0
    # "a" and "d" answer with trace r1, "b" with r2 (its second reply): three final replies
    assert s["eot_to_first_frame_published_ms"]["n"] == 3
    assert s["eot_to_stt_done_ms"]["min"] == 700.0 and s["eot_to_stt_done_ms"]["max"] == 1000.0
    assert s["last_word_to_vad_end_ms"]["min"] == 200.0
    assert s["final_reply_word_recall"]["min"] == pytest.approx(5 / 7, abs=1e-3)


def test_breakdown_without_a_shared_clock_leaves_out_last_word_to_vad_end() -> None:
    s = summarise([_asked((0.2, "turn.end"), (1.0, "reply.start"))], [], same_host=False)
    assert "last_word_to_vad_end_ms" not in s and s["eot_to_stt_done_ms"]["n"] == 0


def test_the_gap_each_final_reply_kept_and_how_long_it_held_ready_audio() -> None:
    traces = [
        {"trace_id": "q", "gap_reason": "question",  # ready at 100.5, released by the gap at 100.7
         "marks": {"vad_end": 100.0, "tts_first_audio": 100.5, "audio_released": 100.7,
                   "first_frame_published": 100.71}},
        {"trace_id": "s", "gap_reason": "statement",  # ready after its gap: never held
         "marks": {"vad_end": 100.0, "tts_first_audio": 101.2, "first_frame_published": 101.21}},
        {"trace_id": "old", "marks": {"vad_end": 100.0, "tts_first_audio": 100.9, "first_frame_published": 100.91}},
        {"trace_id": "cut", "gap_reason": "question", "marks": {"vad_end": 100.0, "stt_done": 100.4}},
    ]  # fmt: skip
    g = gaps(traces)
    assert g["replies"] == {"none": 1, "question": 1, "statement": 1}  # the cut reply had no audio: not timed
    assert g["held_replies"] == 1 and g["held_ms"]["max"] == pytest.approx(200.0) and g["held_ms"]["min"] == 0.0
    assert g["held_share"] == pytest.approx(0.2 / (0.71 + 1.21 + 0.91), abs=1e-3)
    assert g["eot_to_first_frame_published_ms"]["question"]["p50"] == pytest.approx(710.0)
    asked = [_asked((0.2, "turn.end"), (1.0, "reply.start"), sentences=1, qid="a")]
    traces[0]["trace_id"] = "r1"
    assert "gap kept by the final replies: question 1" in table(summarise(asked, traces[:1], same_host=False))


def test_word_recall_counts_each_expected_word_once() -> None:
    assert word_recall("Hi there. Hi!", "hi there") == pytest.approx(2 / 3)
    assert word_recall("Okay. So, why?", "Okay so why") == 1.0


def test_the_set_has_forty_questions_with_inner_pauses_openers_and_singles() -> None:
    questions = load_questions()
    multi = [q for q in questions if q.multi]
    assert len(questions) >= 40 and len(multi) >= 30 and len(questions) - len(multi) >= 5
    assert sum(q.kind == "opener" for q in questions) >= 10
    assert all(PAUSE_RANGE_MS[0] <= p <= PAUSE_RANGE_MS[1] for q in multi for p in q.pauses_ms)


def test_the_followup_set_asks_a_question_then_says_more_after_a_pause() -> None:
    """What the short gap after a question costs: every first sentence is a question, every last a statement."""
    from voxgate.agent.controller import ends_as_question

    questions = load_questions(FOLLOWUP_FILE)
    assert len(questions) >= 8 and all(q.kind == "followup" and len(q.sentences) == 2 for q in questions)
    assert all(ends_as_question(q.sentences[0]) and not ends_as_question(q.sentences[1]) for q in questions)
    assert {q.id for q in questions}.isdisjoint(q.id for q in load_questions())  # recorded into one folder
    assert all(PAUSE_RANGE_MS[0] <= p <= PAUSE_RANGE_MS[1] for q in questions for p in q.pauses_ms)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('sentences = ["A.", "B?"]\npauses_ms = [200]\nexpected = "A. B?"', "pauses must be"),
        ('sentences = ["A.", "B?"]\npauses_ms = [400]\nexpected = "A. C?"', "expected is not"),
        ('sentences = ["A.", "B?"]\npauses_ms = []\nexpected = "A. B?"', "one pause between"),
        ('sentences = "A."\npauses_ms = []\nexpected = "A."', "must be lists"),
        ('sentences = ["A."]\npauses_ms = []', "missing or bad field"),
    ],
)
def test_a_bad_question_is_a_typed_error_naming_it(tmp_path: Path, entry: str, message: str) -> None:
    path = tmp_path / "q.toml"
    path.write_text(f'[[question]]\nid = "bad"\nkind = "context"\n{entry}\n')
    with pytest.raises(QuestionSetError, match=message):
        load_questions(path)
