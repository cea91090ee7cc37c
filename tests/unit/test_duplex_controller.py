"""The duplex turn controller (voxgate/agent/controller.py): scripted event sequences for every
transition and race, and a fuzz of random event orders against its invariants."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.agent.controller import (
    MARKS,
    AudioSent,
    CallEnded,
    CancelReply,
    ControllerConfig,
    ControllerError,
    DuplexController,
    FlushAudio,
    HoldAudio,
    LlmDelta,
    LlmDone,
    LlmFailed,
    Mark,
    Notify,
    PlayoutDone,
    SegmentStarted,
    SpeechEnded,
    SpeechStarted,
    StartReply,
    StartStt,
    State,
    Tick,
    TraceDone,
    Transcript,
    TtsFirstAudio,
    TurnTrace,
    VoiceHeard,
    ends_as_question,
    has_words,
)
from voxgate.bridge.llm import Conversation

SYSTEM = {"role": "system", "content": "Be brief."}


def _controller(**config) -> DuplexController:
    """No minimum gap unless asked (its own tests below): the other scripts keep their actions exact;
    one gap for every turn unless a test asks for a shorter one after a question."""
    config.setdefault("min_gap_s", 0.0)
    config.setdefault("question_gap_s", config["min_gap_s"])
    return DuplexController(ControllerConfig(**config), Conversation(system="Be brief."), call_id="c")


def _only(actions: list, kind: type):
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def _kinds(actions: list) -> list[str]:
    return [type(a).__name__ for a in actions]


def _ask(c: DuplexController, text: str, at: float) -> str:
    """The user says `text` (speech at..at+1, transcript at+1.2); returns the reply's trace id."""
    c.handle(SpeechStarted(at))
    stt = _only(c.handle(SpeechEnded(at + 1.0)), StartStt)
    return _only(c.handle(Transcript(stt.trace_id, stt.part, text, at + 1.2)), StartReply).trace_id


def _play(c: DuplexController, trace: str, segments: list[tuple[str, float]], at: float) -> None:
    """The reply's segments are cut and `seconds` of each is published."""
    for i, (text, seconds) in enumerate(segments):
        c.handle(SegmentStarted(trace, i, text, at))
        c.handle(AudioSent(trace, i, seconds, at))


def _speaking(at: float = 0.0) -> tuple[DuplexController, str]:
    """A controller SPEAKING "One. Two." (a second of each published) of reply c-1."""
    c = _controller()
    trace = _ask(c, "Count.", at)
    _play(c, trace, [("One.", 1.0), ("Two.", 1.0)], at + 1.5)
    assert c.state is State.SPEAKING
    return c, trace


def _trace(actions: list) -> TurnTrace:
    return _only(actions, TraceDone).trace


# ---------------------------------------------------------------------------- a plain turn


def test_a_turn_goes_listening_thinking_speaking_listening_with_every_action():
    c = _controller()
    assert c.state is State.LISTENING
    assert c.handle(SpeechStarted(1.0)) == [
        Notify({"type": "turn.start", "trace_id": "c-1"}),
        Mark("c-1", "vad_start", 1.0),
    ]
    assert c.handle(SpeechEnded(2.0)) == [
        Mark("c-1", "vad_end", 2.0), Notify({"type": "turn.end", "trace_id": "c-1"}), StartStt("c-1", 0)]  # fmt: skip
    assert c.state is State.LISTENING
    assert c.handle(Transcript("c-1", 0, " What time is it? ", 2.3)) == [
        Mark("c-1", "stt_done", 2.3),
        Notify({"type": "transcript", "trace_id": "c-1", "text": "What time is it?"}),
        StartReply("c-1", (SYSTEM, {"role": "user", "content": "What time is it?"})),
        Notify({"type": "reply.start", "trace_id": "c-1"}),
    ]
    assert c.state is State.THINKING
    assert c.handle(LlmDelta("c-1", "It is", 2.5)) == [Mark("c-1", "llm_first_token", 2.5)]
    assert c.handle(LlmDelta("c-1", " noon.", 2.55)) == []
    assert c.handle(SegmentStarted("c-1", 0, "It is noon.", 2.6)) == [Mark("c-1", "first_segment", 2.6)]
    assert c.handle(TtsFirstAudio("c-1", 2.7)) == [Mark("c-1", "tts_first_audio", 2.7)]
    assert c.handle(AudioSent("c-1", 0, 0.02, 2.71)) == [Mark("c-1", "first_frame_published", 2.71)]
    assert c.state is State.SPEAKING
    assert c.handle(AudioSent("c-1", 0, 0.98, 3.7)) == []
    assert c.handle(LlmDone("c-1", 2.8)) == []
    assert c.state is State.SPEAKING  # the LLM finishing does not end the turn; playout does
    marks = {"vad_start": 1.0, "vad_end": 2.0, "stt_done": 2.3, "llm_first_token": 2.5, "first_segment": 2.6,
             "tts_first_audio": 2.7, "first_frame_published": 2.71, "playout_done": 3.8}  # fmt: skip
    assert tuple(marks) == tuple(m for m in MARKS if m not in ("audio_released", "cancel"))  # nothing held or cut
    assert c.handle(PlayoutDone("c-1", 3.8)) == [
        Mark("c-1", "playout_done", 3.8),
        Notify({"type": "reply.end", "trace_id": "c-1", "status": "completed", "heard": "It is noon."}),
        TraceDone(
            TurnTrace("c-1", "completed", "What time is it?", "It is noon.", marks, gap_ms=0.0, gap_reason="question")
        ),
    ]
    assert c.state is State.LISTENING and c.turn is None
    assert c.conversation.turns == [{"role": "user", "content": "What time is it?"},
                                    {"role": "assistant", "content": "It is noon."}]  # fmt: skip
    assert not c.ignored


def test_the_next_request_carries_the_history():
    c = _controller()
    first = _ask(c, "Good morning.", 0.0)
    _play(c, first, [("Hello!", 0.5)], 1.5)
    c.handle(PlayoutDone(first, 2.0))
    c.handle(SpeechStarted(3.0))
    c.handle(SpeechEnded(4.0))
    reply = _only(c.handle(Transcript("c-2", 0, "Bye.", 4.2)), StartReply)
    history = ({"role": "user", "content": "Good morning."}, {"role": "assistant", "content": "Hello!"})
    assert reply.messages == (SYSTEM, *history, {"role": "user", "content": "Bye."})


def test_an_empty_transcript_drops_the_turn_with_no_reply():
    c = _controller()
    c.handle(SpeechStarted(0.0))
    c.handle(SpeechEnded(0.5))
    actions = c.handle(Transcript("c-1", 0, "  ", 0.7))
    assert _kinds(actions) == ["Mark", "Notify", "Notify", "TraceDone"]
    assert actions[2] == Notify({"type": "turn.dropped", "trace_id": "c-1", "reason": "empty"})
    assert _trace(actions).status == "empty"
    assert c.state is State.LISTENING and c.turn is None and c.conversation.turns == []


def test_a_short_turn_while_listening_is_still_transcribed():
    c = _controller()
    c.handle(SpeechStarted(0.0))
    assert _only(c.handle(SpeechEnded(0.1)), StartStt) == StartStt("c-1", 0)  # "No." is short and a turn


def test_an_llm_failure_ends_the_turn_as_failed_with_what_was_heard():
    c = _controller()
    trace = _ask(c, "Tell me.", 0.0)
    _play(c, trace, [("Well,", 0.4)], 1.5)
    assert c.handle(LlmFailed(trace, "llm_timeout", 2.0)) == []
    done = _trace(c.handle(PlayoutDone(trace, 2.5)))
    assert (done.status, done.heard, done.error) == ("failed", "Well,", "llm_timeout")
    assert c.conversation.turns[-1] == {"role": "assistant", "content": "Well,"}


def test_a_failed_reply_with_nothing_heard_does_not_carry_its_words():
    c = _controller()
    trace = _ask(c, "Tell me.", 0.0)
    c.handle(LlmFailed(trace, "llm_bad_response", 1.0))
    assert _trace(c.handle(PlayoutDone(trace, 1.1))).status == "failed"
    c.handle(SpeechStarted(2.0))
    c.handle(SpeechEnded(3.0))
    reply = _only(c.handle(Transcript("c-2", 0, "Are you there?", 3.1)), StartReply)
    assert reply.messages[-1] == {"role": "user", "content": "Are you there?"}  # not "Tell me. Are you there?"


def test_a_reply_with_no_audio_carries_the_user_words_into_the_next_turn():
    c = _controller()
    trace = _ask(c, "Hmm, Paris.", 0.0)
    c.handle(LlmDone(trace, 1.5))
    assert _trace(c.handle(PlayoutDone(trace, 1.6))).heard == ""
    assert c.conversation.turns == []  # nothing was heard, so nothing enters the history
    c.handle(SpeechStarted(2.0))
    c.handle(SpeechEnded(3.0))
    reply = _only(c.handle(Transcript("c-2", 0, "Are you there?", 3.1)), StartReply)
    assert reply.messages[-1] == {"role": "user", "content": "Hmm, Paris. Are you there?"}


# ---------------------------------------------------------------------------- barge-in


def test_barge_in_silences_first_then_cancels_llm_and_tts_and_records_what_was_heard():
    c, trace = _speaking()
    c.handle(AudioSent(trace, 1, 0.1, 3.6))  # 1.1 s of "Two." played
    assert c.handle(SpeechStarted(4.0)) == [Notify({"type": "turn.start", "trace_id": "c-2"}),
                                           Mark("c-2", "vad_start", 4.0)]  # fmt: skip
    assert c.state is State.INTERRUPTING
    assert c.handle(SpeechEnded(4.5)) == [
        Mark("c-2", "vad_end", 4.5), Notify({"type": "turn.end", "trace_id": "c-2"}), StartStt("c-2", 0)]  # fmt: skip
    assert c.state is State.INTERRUPTING  # 0.5 s: the words decide
    actions = c.handle(Transcript("c-2", 0, "Stop, what about Tuesday?", 4.8))
    assert _kinds(actions) == ["Mark", "Notify", "FlushAudio", "CancelReply", "Mark", "Notify", "TraceDone",
                               "StartReply", "Notify"]  # fmt: skip
    assert actions[2:5] == [FlushAudio(trace), CancelReply(trace, "interrupted"), Mark(trace, "cancel", 4.8)]
    cut = _trace(actions)
    assert (cut.trace_id, cut.status, cut.heard, cut.marks["cancel"]) == (trace, "interrupted", "One. Two.", 4.8)
    assert _only(actions, StartReply).messages[1:] == (
        {"role": "user", "content": "Count."}, {"role": "assistant", "content": "One. Two."},
        {"role": "user", "content": "Stop, what about Tuesday?"})  # fmt: skip
    assert c.state is State.THINKING and c.turn.trace_id == "c-2" and c.pending is None


def test_a_segment_cut_before_heard_min_s_is_left_out_of_the_history():
    c = _controller(heard_min_s=0.3)
    trace = _ask(c, "Count.", 0.0)
    _play(c, trace, [("One.", 1.0), ("Two.", 0.2)], 1.5)
    c.handle(SpeechStarted(3.0))
    assert _trace(c.handle(Tick(3.9))).heard == "One."  # 0.2 s of "Two." is not "heard"
    assert c.conversation.turns[-1] == {"role": "assistant", "content": "One."}


def test_speech_shorter_than_the_minimum_does_not_interrupt_and_is_not_transcribed():
    c, trace = _speaking()
    c.handle(SpeechStarted(4.0))
    actions = c.handle(SpeechEnded(4.2))
    assert _kinds(actions) == ["Notify", "TraceDone"] and _trace(actions).status == "short"
    assert c.state is State.SPEAKING and c.turn.trace_id == trace
    c.handle(AudioSent(trace, 1, 0.5, 4.3))
    assert _trace(c.handle(PlayoutDone(trace, 5.0))).status == "completed"
    assert c.conversation.turns[-1] == {"role": "assistant", "content": "One. Two."}


@pytest.mark.parametrize("said", ["uh-huh", "Mm-hmm.", "yeah, ok", "", "..."])
def test_a_backchannel_or_empty_transcript_does_not_interrupt(said):
    c, trace = _speaking()
    c.handle(SpeechStarted(4.0))
    c.handle(SpeechEnded(4.5))
    actions = c.handle(Transcript("c-2", 0, said, 4.7))
    assert not any(isinstance(a, CancelReply | FlushAudio | StartReply) for a in actions)
    assert _trace(actions).status == ("backchannel" if said.strip(" .") else "empty")
    assert c.state is State.SPEAKING and c.turn.trace_id == trace and c.pending is None


def test_the_backchannel_list_is_configurable():
    c = DuplexController(ControllerConfig(backchannels=frozenset({"yeah"})))
    trace = _ask(c, "Count.", 0.0)
    _play(c, trace, [("One.", 1.0)], 1.5)
    c.handle(SpeechStarted(3.0))
    c.handle(SpeechEnded(3.5))
    assert _only(c.handle(Transcript("call-2", 0, "okay", 3.7)), CancelReply).trace_id == trace


def test_speech_still_going_after_confirm_after_s_interrupts_without_waiting_for_words():
    c, trace = _speaking()
    c.handle(SpeechStarted(4.0))
    assert c.handle(Tick(4.7)) == [] and c.state is State.INTERRUPTING
    actions = c.handle(Tick(4.85))
    assert actions[:2] == [FlushAudio(trace), CancelReply(trace, "interrupted")]
    assert c.state is State.LISTENING and c.turn.trace_id == "c-2"  # the user is still talking
    stt = _only(c.handle(SpeechEnded(6.0)), StartStt)
    assert _only(c.handle(Transcript(stt.trace_id, 0, "uh-huh", 6.2)), StartReply)  # confirmed: words no longer judged


def test_long_speech_interrupts_at_its_end_when_no_tick_came():
    c, _ = _speaking()
    c.handle(SpeechStarted(4.0))
    actions = c.handle(SpeechEnded(5.0))
    assert _kinds(actions)[:5] == ["Mark", "Notify", "StartStt", "FlushAudio", "CancelReply"]
    assert c.state is State.LISTENING  # waiting for the transcript of the interruption


def test_speech_during_thinking_cancels_the_unheard_reply_and_merges_the_user_words():
    c = _controller()
    trace = _ask(c, "I want to fly", 0.0)
    c.handle(LlmDelta(trace, "Where", 1.3))
    c.handle(SpeechStarted(1.4))
    assert c.state is State.INTERRUPTING
    c.handle(SpeechEnded(2.0))
    actions = c.handle(Transcript("c-2", 0, "to Paris.", 2.2))
    assert actions[2:4] == [FlushAudio(trace), CancelReply(trace, "interrupted")]
    assert _only(actions, StartReply).messages == (SYSTEM, {"role": "user", "content": "I want to fly to Paris."})
    assert c.conversation.turns == []


def test_a_reply_that_finishes_during_an_undecided_interruption_completes_normally():
    c, trace = _speaking()
    c.handle(SpeechStarted(4.0))
    c.handle(SpeechEnded(4.5))
    actions = c.handle(PlayoutDone(trace, 4.6))
    assert not any(isinstance(a, CancelReply) for a in actions) and _trace(actions).status == "completed"
    assert c.state is State.LISTENING and c.turn.trace_id == "c-2"
    assert _trace(c.handle(Transcript("c-2", 0, "uh-huh", 4.8))).status == "backchannel"  # still no reply to it
    assert c.turn is None and c.conversation.turns[-1] == {"role": "assistant", "content": "One. Two."}


def test_real_words_after_the_reply_finished_start_a_reply_without_a_cancel():
    c, trace = _speaking()
    c.handle(SpeechStarted(4.0))
    c.handle(SpeechEnded(4.5))
    c.handle(PlayoutDone(trace, 4.6))
    actions = c.handle(Transcript("c-2", 0, "And three?", 4.8))
    assert _kinds(actions) == ["Mark", "Notify", "StartReply", "Notify"]


# ---------------------------------------------------------------------------- detail events (the page's)


def _messages(actions: list, kind: str) -> list[dict]:
    return [a.message for a in actions if isinstance(a, Notify) and a.message["type"] == kind]


def test_detail_events_are_off_by_default():
    c = _controller()
    trace = _ask(c, "Count.", 0.0)
    actions = [a for e in (SegmentStarted(trace, 0, "One.", 1.5), AudioSent(trace, 0, 1.0, 1.6),
                           PlayoutDone(trace, 2.6)) for a in c.handle(e)]  # fmt: skip
    assert not _messages(actions, "reply.segment") and not _messages(actions, "turn.trace")


def test_a_segment_is_notified_when_its_audio_starts_being_published_once():
    c = _controller(detail_events=True)
    trace = _ask(c, "Count.", 0.0)
    assert _messages(c.handle(SegmentStarted(trace, 0, " One. ", 1.5)), "reply.segment") == []  # not heard yet
    assert c.handle(SegmentStarted(trace, 1, "Two.", 1.55)) == []
    first = c.handle(AudioSent(trace, 0, 0.02, 1.6))
    assert _messages(first, "reply.segment") == [{"type": "reply.segment", "trace_id": trace, "index": 0,
                                                  "text": "One."}]  # fmt: skip
    assert c.handle(AudioSent(trace, 0, 0.5, 1.7)) == []  # the same segment again: no second notice
    second = _messages(c.handle(AudioSent(trace, 1, 0.02, 2.2)), "reply.segment")
    assert [m["text"] for m in second] == ["Two."]


def test_a_segment_cut_before_any_audio_is_never_notified():
    c = _controller(detail_events=True)
    trace = _ask(c, "Count.", 0.0)
    c.handle(SegmentStarted(trace, 0, "One.", 1.5))
    c.handle(AudioSent(trace, 0, 0.5, 1.6))
    c.handle(SegmentStarted(trace, 1, "Two.", 1.7))
    c.handle(SpeechStarted(2.0))
    actions = c.handle(SpeechEnded(3.0))  # a second of speech over the reply: confirmed, the reply is cut
    assert _only(actions, CancelReply).trace_id == trace
    assert _messages(actions, "reply.segment") == []


def test_a_finished_turn_notifies_its_trace_in_ms_from_the_end_of_speech_before_trace_done():
    c = _controller(detail_events=True)
    c.handle(SpeechStarted(1.0))
    c.handle(SpeechEnded(2.0))
    c.handle(Transcript("c-1", 0, "Good morning.", 2.25))
    c.handle(LlmDelta("c-1", "Hello", 2.5))
    c.handle(SegmentStarted("c-1", 0, "Hello.", 2.6))
    c.handle(TtsFirstAudio("c-1", 2.75))
    c.handle(AudioSent("c-1", 0, 0.5, 2.76))
    actions = c.handle(PlayoutDone("c-1", 3.5))
    assert _messages(actions, "turn.trace") == [{
        "type": "turn.trace", "trace_id": "c-1", "status": "completed",
        "marks": {"vad_start": -1000.0, "vad_end": 0.0, "stt_done": 250.0, "llm_first_token": 500.0,
                  "first_segment": 600.0, "tts_first_audio": 750.0, "first_frame_published": 760.0,
                  "playout_done": 1500.0},
        "gap_ms": 0.0, "gap_reason": "statement",
    }]  # fmt: skip
    assert _kinds(actions)[-2:] == ["Notify", "TraceDone"]  # nothing about a turn after its TraceDone


def test_a_false_interruption_has_no_marks_and_a_cut_reply_has_its_cancel():
    c = _controller(detail_events=True)
    trace = _ask(c, "Count.", 0.0)  # vad_end at 1.0
    _play(c, trace, [("One.", 1.0)], 1.5)
    c.handle(SpeechStarted(3.0))
    short = _messages(c.handle(SpeechEnded(3.1)), "turn.trace")  # too short to interrupt: never reached vad_end
    assert short == [{"type": "turn.trace", "trace_id": "c-2", "status": "short", "marks": {}}]
    cut = _messages(c.handle(CallEnded(4.0)), "turn.trace")
    assert [(m["trace_id"], m["status"], m["marks"]["cancel"]) for m in cut] == [(trace, "ended", 3000.0)]


# ---------------------------------------------------------------------------- races


def test_a_transcript_arriving_after_new_speech_joins_the_same_turn():
    c = _controller()
    c.handle(SpeechStarted(0.0))
    c.handle(SpeechEnded(1.0))
    assert c.handle(SpeechStarted(1.3)) == []  # the same turn: its first vad_start is kept
    assert _kinds(c.handle(Transcript("c-1", 0, "Book a table", 1.4))) == ["Mark", "Notify"]  # user still talking
    assert _only(c.handle(SpeechEnded(2.0)), StartStt) == StartStt("c-1", 1)
    reply = _only(c.handle(Transcript("c-1", 1, "for two.", 2.2)), StartReply)
    assert reply.messages[-1] == {"role": "user", "content": "Book a table for two."}
    assert c.turn.marks["vad_start"] == 0.0 and c.turn.marks["vad_end"] == 2.0


def test_transcripts_out_of_order_wait_for_each_other():
    c = _controller()
    for t in (0.0, 1.5):
        c.handle(SpeechStarted(t))
        c.handle(SpeechEnded(t + 1.0))
    assert _kinds(c.handle(Transcript("c-1", 1, "world", 2.6))) == ["Mark", "Notify"]
    assert _only(c.handle(Transcript("c-1", 0, "hello", 2.7)), StartReply).messages[-1]["content"] == "hello world"


def test_speech_end_without_start_is_ignored_and_counted():
    c = _controller()
    assert c.handle(SpeechEnded(1.0)) == []
    assert c.ignored["speech_end_without_start"] == 1 and c.state is State.LISTENING


def test_a_second_speech_start_is_ignored_and_counted():
    c = _controller()
    c.handle(SpeechStarted(1.0))
    assert c.handle(SpeechStarted(1.1)) == [] and c.ignored["speech_already_started"] == 1


@pytest.mark.parametrize("late", [
    LlmDelta("c-1", "more", 5.0), LlmDone("c-1", 5.0), LlmFailed("c-1", "x", 5.0), TtsFirstAudio("c-1", 5.0),
    SegmentStarted("c-1", 2, "Three.", 5.0), AudioSent("c-1", 1, 0.02, 5.0), PlayoutDone("c-1", 5.0),
])  # fmt: skip
def test_reply_events_for_a_cancelled_turn_are_ignored(late):
    c, _ = _speaking()
    c.handle(SpeechStarted(4.0))
    c.handle(Tick(4.9))  # confirmed: c-1 cancelled
    history = list(c.conversation.turns)
    assert c.handle(late) == [] and c.ignored["stale_reply_event"] == 1
    assert c.conversation.turns == history and c.state is State.LISTENING


def test_events_of_the_cancelled_reply_do_not_touch_the_new_one():
    c, old = _speaking()
    c.handle(SpeechStarted(4.0))
    c.handle(SpeechEnded(4.5))
    new = _only(c.handle(Transcript("c-2", 0, "Stop.", 4.7)), StartReply).trace_id
    for late in (SegmentStarted(old, 2, "Three.", 4.8), AudioSent(old, 2, 0.5, 4.8), PlayoutDone(old, 4.9)):
        assert c.handle(late) == []
    assert c.state is State.THINKING and c.turn.trace_id == new and c.turn.segments == {}
    assert c.ignored["stale_reply_event"] == 3


def test_a_transcript_for_a_dropped_turn_or_a_part_never_asked_is_ignored():
    c = _controller()
    c.handle(SpeechStarted(0.0))
    c.handle(SpeechEnded(0.5))
    c.handle(Transcript("c-1", 0, "", 0.6))  # c-1 dropped
    assert c.handle(Transcript("c-1", 0, "late", 0.7)) == []
    c.handle(SpeechStarted(1.0))
    assert c.handle(Transcript("c-2", 3, "never asked", 1.1)) == [] and c.ignored["stale_transcript"] == 2


def test_a_delta_after_llm_done_a_repeated_segment_and_audio_of_an_unknown_segment_are_ignored():
    c, trace = _speaking()
    c.handle(LlmDone(trace, 3.0))
    assert c.handle(LlmDelta(trace, "extra", 3.1)) == []
    assert c.handle(SegmentStarted(trace, 0, "Other.", 3.2)) == []
    assert c.handle(AudioSent(trace, 7, 0.5, 3.3)) == []
    assert c.ignored == {"delta_after_llm_done": 1, "duplicate_segment": 1, "audio_for_unknown_segment": 1}
    assert _trace(c.handle(PlayoutDone(trace, 4.0))).heard == "One. Two."


def test_a_reply_with_no_event_for_stall_s_is_cancelled_on_a_tick():
    c = _controller(stall_s=5.0)
    trace = _ask(c, "Good morning.", 0.0)  # the reply started at 1.2
    assert c.handle(Tick(6.1)) == []
    actions = c.handle(Tick(6.3))
    assert actions[:2] == [FlushAudio(trace), CancelReply(trace, "stalled")] and _trace(actions).status == "stalled"
    assert c.state is State.LISTENING


def test_a_turn_whose_transcript_never_comes_is_dropped_on_a_tick():
    c = _controller(stall_s=5.0)
    c.handle(SpeechStarted(0.0))
    c.handle(SpeechEnded(1.0))
    assert _trace(c.handle(Tick(6.1))).status == "stalled" and c.turn is None


@pytest.mark.parametrize("where", ["idle", "user speaking", "awaiting stt", "thinking", "speaking", "interrupting"])
def test_call_ended_in_any_state_ends_every_turn_and_ignores_what_follows(where):
    c = _controller()
    live = None
    if where in ("user speaking", "awaiting stt"):
        c.handle(SpeechStarted(0.0))
    if where == "awaiting stt":
        c.handle(SpeechEnded(1.0))
    if where == "thinking":
        live = _ask(c, "Good morning.", 0.0)
    if where in ("speaking", "interrupting"):
        c, live = _speaking()
    if where == "interrupting":
        c.handle(SpeechStarted(4.0))
    actions = c.handle(CallEnded(5.0))
    ended = [a.trace for a in actions if isinstance(a, TraceDone)]
    assert [t.status for t in ended] == {"idle": [], "interrupting": ["ended", "ended"]}.get(where, ["ended"])
    if live:
        assert actions[:2] == [FlushAudio(live), CancelReply(live, "ended")]
    assert c.state is State.LISTENING and c.turn is None and c.pending is None
    assert c.handle(SpeechStarted(6.0)) == [] and c.handle(PlayoutDone("c-1", 6.0)) == []
    assert c.ignored["call_ended"] == 2


def test_impossible_events_raise_a_typed_error():
    with pytest.raises(ControllerError):
        AudioSent("c-1", 0, -0.02, 1.0)
    with pytest.raises(ControllerError):
        Transcript("c-1", -1, "x", 1.0)
    with pytest.raises(ControllerError):
        _controller().handle("speech started")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ControllerConfig(min_interruption_s=1.0, confirm_after_s=0.5)


def test_backchannels_are_told_from_words():
    assert not has_words("Uh-huh.") and not has_words("yeah, yeah ok") and not has_words("") and not has_words("嗯")
    assert has_words("yeah but no") and has_words("Stop!") and has_words("等一下")


# ---------------------------------------------------------------------------- fuzz

# "next" is the plausible next event of the call as it stands (so that runs reach replies and
# barge-ins); the other kinds come at random, in any order, for the races.
_KINDS = ["next"] * 8 + ["start", "end", "transcript", "delta", "llm_done", "llm_failed", "segment", "tts", "audio",
                         "playout", "tick", "voice"]  # fmt: skip
_SAID = ["", "uh-huh", "ok.", "hello there", "wait, stop", "why?"]


def _next(c: DuplexController, pick: int, said: str, seconds: float, at: float):
    """What would plausibly happen next (it reads the controller only to choose the input)."""
    user = c.pending or c.turn
    if user is not None and user.speaking_since is not None:
        return SpeechEnded(at)
    if user is not None and None in user.parts:
        return Transcript(user.trace_id, user.parts.index(None), said, at)
    if c.turn is None or not c.turn.replying:
        return SpeechStarted(at)
    trace, n = c.turn.trace_id, len(c.turn.segments)
    if n == 0 or pick == 4:
        return SegmentStarted(trace, n, f"{trace}#{n}", at)
    return PlayoutDone(trace, at) if pick == 5 else AudioSent(trace, n - 1, seconds, at)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 5), st.integers(0, 3), st.sampled_from(_SAID),
                          st.floats(0, 0.7), st.sampled_from([0.0, 0.1, 0.5])), min_size=10, max_size=80))  # fmt: skip
def test_random_event_orders_keep_the_invariants(steps):
    c = _controller(stall_s=3.0, min_gap_s=0.5, question_gap_s=0.2)
    seen: list[str] = []  # trace ids the controller gave out, newest last
    asked: dict[str, int] = {}  # the last transcript part asked for, per trace
    live: set[str] = set()  # replies started and not yet cancelled or finished
    replied: set[str] = set()  # replies started
    done: set[str] = set()
    cut: set[str] = set()  # segment texts fed
    sounded: set[str] = set()  # segment texts fed, then some audio of them
    held: list[str] = []  # the reply whose audio is held, if any

    def check(actions: list) -> None:
        for i, action in enumerate(actions):
            trace = action.trace.trace_id if isinstance(action, TraceDone) else getattr(action, "trace_id", None)
            if trace is None:
                trace = action.message["trace_id"]
            assert trace not in done, f"{action} after its turn ended"
            if trace not in seen:
                seen.append(trace)
            if isinstance(action, HoldAudio):
                assert (action.hold and not held and trace in live) or (not action.hold and held == [trace])
                held[:] = [trace] if action.hold else []
            elif isinstance(action, StartStt):
                asked[trace] = action.part
            elif isinstance(action, StartReply):
                assert not live, "a new reply while another is live (no cancel before it)"
                live.add(trace)
                replied.add(trace)
                assert action.messages[-1]["role"] == "user" and action.messages[-1]["content"]
            elif isinstance(action, FlushAudio):
                assert trace in live and actions[i + 1] == CancelReply(trace, actions[i + 1].reason)
            elif isinstance(action, CancelReply):
                assert trace in live and actions[i - 1] == FlushAudio(trace)
                live.discard(trace)
            elif isinstance(action, TraceDone):
                gap = {None: None, "question": 200.0, "statement": 500.0, "opener": 500.0}[action.trace.gap_reason]
                assert action.trace.gap_ms == gap and (gap is None) == (trace not in replied)
                assert all(p.startswith(f"{trace}#") for p in action.trace.heard.split(" ") if p), "another turn's text"
                live.discard(trace)
                done.add(trace)
        assert c.state in State and (c.state is State.LISTENING) == (not live)
        assert (c.pending is None) or (c.turn is not None and c.turn.replying)
        for message in c.conversation.turns:
            assert message["content"]
            if message["role"] == "assistant":
                assert all(p in sounded for p in message["content"].split(" ")), "history holds text nobody heard"

    at = 0.0
    for kind, pick, index, said, dt, seconds in steps:
        at += dt
        # mostly the live reply's id or the newest one; sometimes an older one, or one never given out
        choices = [*sorted(live), *seen[-1:]] or ["c-99"]
        trace = choices[pick % len(choices)] if pick < 4 else seen[-2] if pick == 4 and len(seen) > 1 else "c-99"
        part = asked.get(trace, 0) if index < 3 else index
        event = _next(c, pick, said, seconds, at) if kind == "next" else {
            "start": SpeechStarted(at), "end": SpeechEnded(at), "transcript": Transcript(trace, part, said, at),
            "delta": LlmDelta(trace, "x", at), "llm_done": LlmDone(trace, at), "llm_failed": LlmFailed(trace, "e", at),
            "segment": SegmentStarted(trace, index, f"{trace}#{index}", at), "tts": TtsFirstAudio(trace, at),
            "audio": AudioSent(trace, index, seconds, at), "playout": PlayoutDone(trace, at), "tick": Tick(at),
            "voice": VoiceHeard(at),
        }[kind]  # fmt: skip
        if isinstance(event, SegmentStarted):
            cut.add(event.text)
        if isinstance(event, AudioSent) and event.duration_s > 0 and f"{event.trace_id}#{event.segment}" in cut:
            sounded.add(f"{event.trace_id}#{event.segment}")
        check(c.handle(event))
    check(c.handle(CallEnded(at + 1)))
    assert not live and c.turn is None and c.pending is None and not held
    assert set(seen) == done  # every turn ended with a trace: none stuck


# ---------------------------------------------------------------------------- openers


def test_an_opener_alone_waits_for_the_question_that_follows_and_one_reply_answers_both():
    """ "Hi there." + a pause + the question: the pause is not the end of the turn (the VAD and
    the turn model hear "Hi there." as finished; its words say a question may follow)."""
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    first = _only(c.handle(SpeechEnded(0.8)), StartStt)
    assert not [
        a for a in c.handle(Transcript(first.trace_id, first.part, "Hi there.", 1.1)) if isinstance(a, StartReply)
    ]
    assert not [a for a in c.handle(Tick(1.5)) if isinstance(a, StartReply)]  # still within the hold
    c.handle(SpeechStarted(1.6))  # the question comes
    second = _only(c.handle(SpeechEnded(3.5)), StartStt)
    assert second.trace_id == first.trace_id  # the same turn
    reply = _only(c.handle(Transcript(second.trace_id, second.part, "What is the tallest mountain?", 3.9)), StartReply)
    assert reply.messages[-1] == {"role": "user", "content": "Hi there. What is the tallest mountain?"}


@pytest.mark.parametrize("text", ["Okay. So,", "Hmm, well...", "Yeah.", "Um, let me think.", "Hi! You know,"])
def test_openers_and_fillers_are_held(text):
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(0.8)), StartStt)
    assert not [a for a in c.handle(Transcript(stt.trace_id, stt.part, text, 1.0)) if isinstance(a, StartReply)]


def test_an_opener_alone_is_answered_once_its_hold_is_over():
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(0.8)), StartStt)
    c.handle(Transcript(stt.trace_id, stt.part, "Hello!", 1.1))
    assert not [a for a in c.handle(Tick(1.9)) if isinstance(a, StartReply)]
    reply = _only(c.handle(Tick(2.0)), StartReply)  # 1.2 s after the speech ended
    assert reply.messages[-1] == {"role": "user", "content": "Hello!"}


@pytest.mark.parametrize("text", ["Yes.", "No.", "Hi, what time is it?", "Okay, book it."])
def test_a_turn_with_more_than_an_opener_is_answered_at_once(text):
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(0.8)), StartStt)
    _only(c.handle(Transcript(stt.trace_id, stt.part, text, 1.0)), StartReply)


# ---------------------------------------------------------------------------- speech over an unheard reply


def test_speech_over_a_reply_nobody_heard_holds_it_then_one_reply_answers_the_whole_question():
    c = _controller()
    first = _ask(c, "I'm learning Spanish.", 0.0)  # the reply starts at 1.2; none of it published
    assert _only(c.handle(SpeechStarted(1.5)), HoldAudio) == HoldAudio(first, True)
    actions = c.handle(SpeechEnded(2.6))  # 1.1 s of speech: an interruption
    kinds = _kinds(actions)
    assert kinds.index("FlushAudio") < kinds.index("HoldAudio") < kinds.index("TraceDone")
    assert HoldAudio(first, False) in actions
    stt = _only(actions, StartStt)
    reply = _only(c.handle(Transcript(stt.trace_id, stt.part, "How do I practise?", 3.0)), StartReply)
    assert reply.messages[-1] == {"role": "user", "content": "I'm learning Spanish. How do I practise?"}


def test_a_short_sound_over_an_unheard_reply_releases_it():
    c = _controller()
    first = _ask(c, "What time is it?", 0.0)
    c.handle(SpeechStarted(1.5))
    actions = c.handle(SpeechEnded(1.6))  # 0.1 s: too short to interrupt
    assert HoldAudio(first, False) in actions and not [a for a in actions if isinstance(a, CancelReply)]
    assert c.turn is not None and c.turn.trace_id == first and c.turn.replying


def test_speech_over_a_reply_already_heard_does_not_hold_it():
    c, _ = _speaking()
    assert not [a for a in c.handle(SpeechStarted(5.0)) if isinstance(a, HoldAudio)]


# ---------------------------------------------------------------------------- the minimum gap


def _question(c: DuplexController, text: str, voice_end: float, transcript_at: float) -> list:
    """The user spoke until `voice_end`; the turn ended 0.3 s later; the transcript comes at
    `transcript_at`. Returns the transcript's actions."""
    c.handle(SpeechStarted(voice_end - 1.0))
    stt = _only(c.handle(SpeechEnded(voice_end + 0.3, voice_end=voice_end)), StartStt)
    return c.handle(Transcript(stt.trace_id, stt.part, text, transcript_at))


def test_a_reply_ready_within_the_gap_is_held_until_the_gap_after_the_last_voice_is_over():
    c = _controller(min_gap_s=1.0)
    actions = _question(c, "What time is it?", voice_end=1.0, transcript_at=1.5)
    reply = _only(actions, StartReply).trace_id
    assert actions[-1] == HoldAudio(reply, True)
    assert c.handle(TtsFirstAudio(reply, 1.7)) == [Mark(reply, "tts_first_audio", 1.7)]
    assert not [a for a in c.handle(Tick(1.95)) if isinstance(a, HoldAudio)]
    assert c.handle(Tick(2.0)) == [HoldAudio(reply, False), Mark(reply, "audio_released", 2.0)]  # 1 s after the voice


def test_a_reply_ready_after_the_gap_is_never_held():
    c = _controller(min_gap_s=1.0)
    actions = _question(c, "What time is it?", voice_end=1.0, transcript_at=2.2)
    _only(actions, StartReply)
    assert not [a for a in actions if isinstance(a, HoldAudio)]


def test_without_voice_end_the_gap_counts_from_the_end_of_the_speech():
    c = _controller(min_gap_s=1.0)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(1.0)), StartStt)
    reply = _only(c.handle(Transcript(stt.trace_id, stt.part, "Hello there, how are you?", 1.4)), StartReply)
    assert not [a for a in c.handle(Tick(1.95)) if isinstance(a, HoldAudio)]
    assert c.handle(Tick(2.0))[0] == HoldAudio(reply.trace_id, False)


def test_the_user_going_on_within_the_gap_cancels_the_unheard_reply_and_one_reply_answers_the_whole_question():
    """The class of the bench's audible-too-soon misses: a pause of 650-900 ms inside the
    question ended the turn, and the reply was ready before the user went on."""
    c = _controller(min_gap_s=1.0)
    first = _only(_question(c, "The leaves of my plant are turning yellow.", 1.0, 1.4), StartReply).trace_id
    c.handle(SegmentStarted(first, 0, "Yellow leaves", 1.6))
    c.handle(TtsFirstAudio(first, 1.7))
    assert not [a for a in c.handle(SpeechStarted(1.85)) if isinstance(a, HoldAudio)]  # still held: no change
    assert c.state is State.INTERRUPTING
    assert not [a for a in c.handle(Tick(2.1)) if isinstance(a, HoldAudio)]  # the gap is over; the speech undecided
    actions = c.handle(SpeechEnded(3.2, voice_end=2.9))
    kinds = _kinds(actions)
    assert kinds.index("FlushAudio") < kinds.index("CancelReply") < kinds.index("HoldAudio") < kinds.index("TraceDone")
    assert _trace(actions).status == "interrupted" and _trace(actions).heard == ""
    stt = _only(actions, StartStt)
    second = c.handle(Transcript(stt.trace_id, stt.part, "What am I doing wrong?", 3.6))
    assert _only(second, StartReply).messages[-1] == {
        "role": "user", "content": "The leaves of my plant are turning yellow. What am I doing wrong?"}  # fmt: skip
    assert second[-1] == HoldAudio(stt.trace_id, True)  # 0.7 s after the voice: its own gap


def test_voice_heard_holds_an_unheard_reply_past_the_gap_until_it_is_confirmed_or_gone():
    c = _controller(min_gap_s=1.0, onset_wait_s=0.1)
    reply = _only(_question(c, "What time is it?", 1.0, 1.5), StartReply).trace_id
    c.handle(VoiceHeard(1.96))
    assert not [a for a in c.handle(Tick(2.0)) if isinstance(a, HoldAudio)]  # voice heard 40 ms ago
    c.handle(VoiceHeard(2.02))
    assert not [a for a in c.handle(Tick(2.1)) if isinstance(a, HoldAudio)]
    assert c.handle(Tick(2.15))[0] == HoldAudio(reply, False)  # a click, never confirmed as speech


def test_voice_heard_then_confirmed_keeps_the_reply_held_as_speech_over_it():
    c = _controller(min_gap_s=1.0, onset_wait_s=0.1)
    reply = _only(_question(c, "What time is it?", 1.0, 1.5), StartReply).trace_id
    c.handle(VoiceHeard(1.95))
    assert not [a for a in c.handle(SpeechStarted(2.04)) if isinstance(a, HoldAudio)]
    assert not [a for a in c.handle(Tick(2.5)) if isinstance(a, HoldAudio)]
    actions = c.handle(SpeechEnded(2.6))  # 0.56 s: transcribed, then judged by its words
    assert not [a for a in actions if isinstance(a, HoldAudio)]
    stt = _only(actions, StartStt)
    assert HoldAudio(reply, False) in c.handle(Transcript(stt.trace_id, stt.part, "Uh-huh.", 2.9))


def test_voice_heard_does_not_hold_a_reply_already_heard():
    c, _ = _speaking()
    assert c.handle(VoiceHeard(5.0)) == []
    assert c.handle(Tick(5.05)) == []


def test_a_voice_end_after_the_speech_end_and_a_negative_gap_are_refused():
    with pytest.raises(ControllerError):
        SpeechEnded(1.0, voice_end=1.5)
    with pytest.raises(ValueError):
        ControllerConfig(min_gap_s=-1)


# ---------------------------------------------------------------------------- the gap after a finished question


def _gaps(**config) -> DuplexController:
    """The defaults' shape: 1 s after a statement, 0.6 s after a question."""
    return _controller(min_gap_s=1.0, question_gap_s=0.6, **config)


def test_a_finished_question_is_released_at_the_short_gap_and_its_trace_says_why():
    c = _gaps()
    actions = _question(c, "What is the tallest mountain in the world?", voice_end=1.0, transcript_at=1.3)
    reply = _only(actions, StartReply).trace_id
    assert actions[-1] == HoldAudio(reply, True) and c.release_at() == pytest.approx(1.6)
    assert not [a for a in c.handle(Tick(1.6 - 1e-6)) if isinstance(a, HoldAudio)]
    assert c.handle(Tick(1.6)) == [HoldAudio(reply, False), Mark(reply, "audio_released", 1.6)]
    c.handle(SegmentStarted(reply, 0, "Everest.", 1.65))
    c.handle(AudioSent(reply, 0, 0.5, 1.7))
    trace = _trace(c.handle(PlayoutDone(reply, 2.2)))
    assert (trace.gap_ms, trace.gap_reason) == (600.0, "question")


@pytest.mark.parametrize(("text", "reason"), [("I have six eggs in the fridge.", "statement"),
                                              ("Tell me about Rome", "statement"),
                                              ("Okay?", "opener"), ("Right, thanks?", "opener")])  # fmt: skip
def test_a_statement_or_an_opener_keeps_the_long_gap(text, reason):
    c = _gaps(opener_hold_s=0.0)  # an opener answered at once here, to see its gap
    reply = _only(_question(c, text, voice_end=1.0, transcript_at=1.3), StartReply).trace_id
    assert c.release_at() == pytest.approx(2.0)
    assert not [a for a in c.handle(Tick(1.9)) if isinstance(a, HoldAudio)]
    assert c.handle(Tick(2.0))[0] == HoldAudio(reply, False)
    assert c.gap_for(text) == (1.0, reason)


def test_an_opener_still_waits_for_the_question_and_the_whole_turn_gets_the_short_gap():
    c = _gaps(opener_hold_s=1.2)
    assert not [a for a in _question(c, "Hi there.", 1.0, 1.3) if isinstance(a, StartReply)]
    assert not [a for a in c.handle(Tick(2.2)) if isinstance(a, StartReply)]  # the hold runs from vad_end (1.3)
    c.handle(SpeechStarted(2.4))
    stt = _only(c.handle(SpeechEnded(4.3, voice_end=4.0)), StartStt)
    reply = _only(c.handle(Transcript(stt.trace_id, stt.part, "What is the tallest mountain?", 4.5)), StartReply)
    assert reply.messages[-1]["content"] == "Hi there. What is the tallest mountain?"
    assert c.release_at() == pytest.approx(4.6)


def test_a_statement_then_a_question_within_the_long_gap_is_one_reply():
    """The context class of the set: the statement's reply is held 1 s, so a pause of 0.8 s (longer
    than the short gap) still finds it unheard; the whole question then gets the short gap."""
    c = _gaps()
    first = _only(_question(c, "I have six eggs in the fridge.", voice_end=1.0, transcript_at=1.3), StartReply)
    c.handle(SegmentStarted(first.trace_id, 0, "Make an omelette.", 1.5))
    c.handle(TtsFirstAudio(first.trace_id, 1.6))
    assert not [a for a in c.handle(Tick(1.7)) if isinstance(a, HoldAudio)]  # past 0.6 s: still held
    c.handle(VoiceHeard(1.8))
    c.handle(SpeechStarted(1.85))
    assert not [a for a in c.handle(Tick(2.1)) if isinstance(a, HoldAudio)]  # undecided speech over it
    actions = c.handle(SpeechEnded(3.3, voice_end=3.0))
    assert _trace(actions).status == "interrupted" and _trace(actions).heard == ""
    stt = _only(actions, StartStt)
    second = c.handle(Transcript(stt.trace_id, stt.part, "What can I cook for dinner?", 3.4))
    assert _only(second, StartReply).messages[-1]["content"] == (
        "I have six eggs in the fridge. What can I cook for dinner?")  # fmt: skip
    assert second[-1] == HoldAudio(stt.trace_id, True) and c.release_at() == pytest.approx(3.6)


def test_speech_resuming_within_the_short_gap_cancels_the_unheard_reply_and_joins_the_turn():
    """A question followed by context after a short pause: one reply to both, and the turn now ends
    as a statement, so it keeps the long gap."""
    c = _gaps()
    first = _only(_question(c, "What should I cook?", voice_end=1.0, transcript_at=1.3), StartReply).trace_id
    c.handle(TtsFirstAudio(first, 1.4))
    c.handle(VoiceHeard(1.5))  # 0.5 s after the voice: the user goes on
    c.handle(SpeechStarted(1.75))
    assert not [a for a in c.handle(Tick(1.8)) if isinstance(a, HoldAudio)]  # past the short gap, still held
    actions = c.handle(SpeechEnded(3.0, voice_end=2.7))
    assert _trace(actions).heard == "" and (_trace(actions).gap_ms, _trace(actions).gap_reason) == (600.0, "question")
    stt = _only(actions, StartStt)
    second = c.handle(Transcript(stt.trace_id, stt.part, "I have eggs and rice.", 3.3))
    assert _only(second, StartReply).messages[-1]["content"] == "What should I cook? I have eggs and rice."
    assert c.release_at() == pytest.approx(3.7)
    assert not c.conversation.turns  # nothing was heard


def test_the_short_gaps_cost_a_question_followed_by_more_after_a_longer_pause_hears_the_first_reply():
    """The trade-off the docstring states: past the short gap a ready reply is heard, and the rest
    of the user's words barge in on it."""
    c = _gaps()
    first = _only(_question(c, "What should I cook?", voice_end=1.0, transcript_at=1.3), StartReply).trace_id
    c.handle(Tick(1.6))
    _play(c, first, [("Try an omelette.", 0.3)], 1.65)
    assert not [a for a in c.handle(SpeechStarted(1.9)) if isinstance(a, HoldAudio)]  # heard: not held
    assert c.state is State.INTERRUPTING


def test_the_question_gap_is_never_longer_than_the_minimum_gap():
    c = _controller(min_gap_s=0.4, question_gap_s=0.6)
    assert c.gap_for("Why?") == (0.4, "question")
    with pytest.raises(ValueError):
        ControllerConfig(question_gap_s=-0.1)


@pytest.mark.parametrize(("text", "question"), [("Why?", True), ("What is it? ", True), ('He said "why?"', True),
                                                ("Really?!", True), ("为什么？", True), ("Why is it? I see.", False),
                                                ("Why.", False), ("", False), ("?x", False)])  # fmt: skip
def test_a_question_is_told_by_its_last_sentence(text, question):
    assert ends_as_question(text) is question


# ---------------------------------------------------------------------------- acknowledgements


@pytest.mark.parametrize("text", ["Okay, thanks.", "Alright, cool.", "Got it, so", "Thank you.", "Oh, I see.",
                                  "Great, thanks so much.", "Perfect. Sounds good."])  # fmt: skip
def test_phrases_that_acknowledge_or_close_wait_for_a_question_like_openers(text):
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(0.8)), StartStt)
    assert not [a for a in c.handle(Transcript(stt.trace_id, stt.part, text, 1.0)) if isinstance(a, StartReply)]
    c.handle(SpeechStarted(1.5))  # the question follows: the same turn, one reply
    more = _only(c.handle(SpeechEnded(2.5)), StartStt)
    reply = _only(c.handle(Transcript(more.trace_id, more.part, "How do I make green tea?", 2.8)), StartReply)
    assert reply.messages[-1]["content"] == f"{text} How do I make green tea?"


@pytest.mark.parametrize("text", ["Thanks, what time is it?", "Is it good?", "Cool, book it.", "Good morning!"])
def test_an_acknowledgement_with_more_words_is_answered_at_once(text):
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(0.8)), StartStt)
    _only(c.handle(Transcript(stt.trace_id, stt.part, text, 1.0)), StartReply)


def test_a_closing_thanks_alone_is_still_answered_after_the_hold():
    c = _controller(opener_hold_s=1.2)
    c.handle(SpeechStarted(0.0))
    stt = _only(c.handle(SpeechEnded(0.8)), StartStt)
    c.handle(Transcript(stt.trace_id, stt.part, "Thanks!", 1.0))
    assert _only(c.handle(Tick(2.0)), StartReply).messages[-1] == {"role": "user", "content": "Thanks!"}


def test_release_at_is_the_first_moment_a_tick_lets_held_audio_go():
    """The driver ticks at `release_at()` (not up to `tick_s` later): a tick just before it keeps
    the audio held, one at it releases it, for the gap and for unconfirmed voice alike."""
    c = _controller(min_gap_s=1.0, onset_wait_s=0.1)
    assert c.release_at() is None  # nothing held
    reply = _only(_question(c, "What time is it?", voice_end=1.0, transcript_at=1.5), StartReply).trace_id
    assert c.release_at() == 2.0
    assert not [a for a in c.handle(Tick(2.0 - 1e-6)) if isinstance(a, HoldAudio)]
    c.handle(VoiceHeard(1.95))  # voice, not yet speech: held 0.1 s past it
    assert c.release_at() == pytest.approx(2.05)
    assert not [a for a in c.handle(Tick(2.05 - 1e-6)) if isinstance(a, HoldAudio)]
    assert c.handle(Tick(c.release_at()))[0] == HoldAudio(reply, False)
    assert c.release_at() is None  # released


def test_release_at_is_none_while_speech_over_the_held_reply_is_undecided():
    c = _controller(min_gap_s=1.0)
    _only(_question(c, "What time is it?", voice_end=1.0, transcript_at=1.5), StartReply)
    c.handle(SpeechStarted(1.8))
    assert c.state is State.INTERRUPTING and c.release_at() is None
    # past the gap, not yet past confirm_after_s: the speech is judged by its end or its words, not the clock
    assert not [a for a in c.handle(Tick(2.5)) if isinstance(a, HoldAudio)]
