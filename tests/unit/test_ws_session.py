"""The WebSocket session state machine, without sockets (docs/protocol.md)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.serving.session import Session, count_units
from voxgate.serving.wsproto import ProtocolError, SessionStart, TextDelta, parse_client
from voxgate.text import split_units


def _session(**config) -> Session:
    return Session("s1", SessionStart(type="session.start", **config), 24000, replay_bytes=1 << 20)


def _delta(text: str, first: int | None) -> TextDelta:
    return TextDelta(type="text.delta", text=text, first_unit_index=first)


def _words(n: int, end: bool = False, **config) -> Session:
    """A session (segments of 2 words) that has had words w0..w{n-1}, and text.end if `end`."""
    s = _session(max_pending_units=2, **config)
    for i in range(n):
        s.delta(_delta(f"w{i} ", i))
    if end:
        s.end()
    return s


def _speak_all(s: Session) -> None:
    """Play the engine: every queued segment gets one audio piece and finishes."""
    while (segment := s.take_segment()) is not None:
        s.audio(segment, b"\x00\x01" * 10, 10)
        s.segment_done(segment)


def _drain(s: Session) -> list[dict]:
    out = []
    while (entry := s.unsent()) is not None:
        out.append(entry.message)
        s.mark_sent()
    return out


def test_units_are_words_or_cjk_characters_or_characters():
    assert count_units("Hello, world! ", "words") == 2
    assert count_units("你好世界", "words") == 4
    assert count_units("Say 你好 now", "words") == 4
    assert count_units("ab c", "chars") == 3
    assert count_units("   ", "words") == 0


def test_segments_cut_at_sentence_ends_and_at_the_pending_limit():
    s = _session(max_pending_units=3)
    for i, word in enumerate(["One ", "two. ", "Three ", "four ", "five ", "six "]):
        s.delta(_delta(word, i))
    cuts = []
    while (segment := s.take_segment()) is not None:
        cuts.append((segment.text, segment.unit_start, segment.unit_end))
        s.segment_done(segment)
    assert cuts == [("One two.", 0, 1), ("Three four five", 2, 4)]
    s.flush()
    assert s.take_segment().unit_start == 5 and s.next_unit == 6


def test_speakable_says_when_a_segment_waits_for_the_engine():
    s = _session()
    s.delta(_delta("Hello ", 0))
    assert not s.speakable  # text gathered: the gateway wakes nobody
    s.delta(_delta("there. ", 1))
    assert s.speakable
    segment = s.take_segment()
    assert not s.speakable
    s.delta(_delta("More ", 2))
    s.flush()
    assert s.speakable  # queued behind the one in flight
    s.segment_done(segment)
    assert s.take_segment().text == "More"


def test_a_number_with_a_point_does_not_end_a_sentence():
    s = _session(starter_units=0)
    s.delta(_delta("Pi is 3.14 and ", 0))
    assert s.take_segment() is None


def test_gap_and_overlap_are_refused_and_change_nothing():
    s = _session()
    s.delta(_delta("one two ", 0))
    with pytest.raises(ProtocolError) as gap:
        s.delta(_delta("four ", 3))
    assert gap.value.code == "unit_gap" and gap.value.extra == {"expected_unit_index": 2}
    with pytest.raises(ProtocolError) as overlap:
        s.delta(_delta("two ", 1))
    assert overlap.value.code == "unit_overlap"
    assert s.next_unit == 2
    s.delta(_delta("three ", None))  # no index: the server numbers it
    assert s.next_unit == 3


def test_utterance_lifecycle_and_connection_reuse():
    s = _session()
    s.delta(_delta("Hello there. ", 0))
    s.end()
    with pytest.raises(ProtocolError) as late:
        s.delta(_delta("more ", 2))
    assert late.value.code == "utterance_ending"
    _speak_all(s)
    kinds = [m["type"] for m in _drain(s)]
    assert kinds == ["audio", "units.done", "utterance.done"]
    s.delta(_delta("Again. ", 2))  # the next utterance on the same session
    s.finish()
    _speak_all(s)
    messages = _drain(s)
    assert [m["type"] for m in messages] == ["audio", "units.done", "utterance.done", "session.done"]
    assert messages[0]["seq"] == 1 and messages[0]["utterance"] == 1 and messages[-1]["units"] == 3
    assert s.done


def test_cancel_drops_the_utterances_unsent_audio_and_queued_segments():
    s = _session(max_pending_units=1)
    for i in range(3):
        s.delta(_delta(f"w{i} ", i))
    first = s.take_segment()
    s.audio(first, b"ab", 1)
    s.audio(first, b"cd", 1)
    s.mark_sent()  # one audio message already went out
    assert s.cancel() == 0
    s.audio(first, b"ef", 1)  # the engine's late chunk is discarded
    s.segment_done(first)
    assert s.take_segment() is None
    rest = _drain(s)
    assert [m["type"] for m in rest] == ["utterance.done"]
    assert rest[0]["status"] == "cancelled" and rest[0]["unit_end"] == 2
    s.delta(_delta("next ", 3))
    s.flush()
    assert s.take_segment().utterance == 1


def test_resume_replays_whole_segments_after_the_last_unit_received():
    s = _session(max_pending_units=2)
    for i in range(6):
        s.delta(_delta(f"w{i} ", i))
    s.end()
    _speak_all(s)
    first = _drain(s)
    units_done = [m for m in first if m["type"] == "units.done"]
    assert [(m["unit_start"], m["unit_end"]) for m in units_done] == [(0, 1), (2, 3), (4, 5)]
    s.resume(1)  # the client had the first segment only
    again = _drain(s)
    assert again == first[2:]  # from the second segment's audio on: no gap, nothing it had
    s.resume(5)  # it had every unit but missed the utterance's end
    assert [m["type"] for m in _drain(s)] == ["utterance.done"]
    with pytest.raises(ProtocolError) as refused:
        s.resume(6)
    assert refused.value.code == "resume_not_available"


def test_a_segment_stopped_midway_is_voiced_again_whole_and_a_resume_gets_it_once():
    """`requeue` (the engine gave the row of a session nobody listened to to someone else): the
    segment's audio so far leaves the log, sent or not, and the segment is taken again first;
    voiced again, its first audio opens the utterance again, and a resume from before it gets
    that segment's new audio once, then its units.done: every unit, no audio twice."""
    s = _words(4, end=True)
    first = s.take_segment()
    s.audio(first, b"\x00\x01" * 10, 10)
    s.segment_done(first)
    cut = s.take_segment()
    s.audio(cut, b"\x01\x02" * 10, 10, stamps=(1.0,))
    s.mark_sent()  # the first segment's audio and units.done went out before the socket dropped
    s.mark_sent()
    s.mark_sent()  # and the cut segment's first audio
    s.audio(cut, b"\x02\x03" * 10, 10)  # made while nobody listened
    logged_bytes, samples = s.unsent_bytes, s.audio_samples
    assert s.requeue(cut)  # some of it went out on the socket that was attached since the start
    assert s.unsent() is None and s.unsent_bytes == logged_bytes - (64 + 20) and s.audio_samples == samples - 20
    again_cut = s.take_segment()  # first again, whole
    assert (again_cut.unit_start, again_cut.unit_end, again_cut.again) == (2, 3, True)
    s.audio(again_cut, b"\x03\x04" * 10, 10, stamps=(2.0,))
    s.segment_done(again_cut)
    _speak_all(s)
    live = _drain(s)  # the socket, still attached or back, is sent what is new: nothing twice
    assert [m["type"] for m in live] == ["audio", "units.done", "utterance.done"]
    entry = next(e for e in s._log if e.message is live[0])
    assert entry.first and entry.stamps == (2.0,) and not entry.opens_utterance  # the second segment's
    assert entry.ready_at is None  # its first audio was timed when first voiced: not again
    s.resume(1)  # a client that had the first segment only
    again = _drain(s)
    audio = [m for m in again if m["type"] == "audio"]
    assert again == live and [(m["unit_start"], m["unit_end"]) for m in audio] == [(2, 3)]  # the new audio, once
    assert audio[0]["seq"] > 2  # the dropped messages' seq numbers are not used again


def test_a_requeue_takes_back_all_the_segments_samples_even_those_trimmed_from_the_replay_buffer():
    s = Session("s1", SessionStart(type="session.start", max_pending_units=2), 24000, replay_bytes=300)
    for i in range(4):
        s.delta(_delta(f"w{i} ", i))
    first = s.take_segment()
    s.audio(first, b"\x00\x01" * 10, 10)
    s.segment_done(first)
    cut = s.take_segment()
    for _ in range(6):  # sent as made: the oldest go out of the 300-byte replay buffer
        s.audio(cut, b"\x01\x02" * 50, 50)
        _drain(s)
    assert s.audio_samples == 310 and s._trimmed_key >= cut.unit_end  # some of the cut segment was trimmed
    s.requeue(cut)
    assert s.audio_samples == 10  # the first segment's only: session.done's audio_s counts what was kept


def test_an_entry_removed_while_its_bytes_are_on_the_way_moves_nothing_when_sent():
    """The writer takes an entry and awaits its sends (a slow socket); meanwhile a cancel, or a
    requeue, removes it. Marking it sent then must not skip what now stands at the cursor (the
    cancel's utterance.done), nor fail on an empty log; and a requeue counts the entry on its way
    as heard by the socket."""
    s = _words(2)
    segment = s.take_segment()
    s.audio(segment, b"\x00\x01" * 10, 10)
    entry = s.unsent()
    s.sending(entry)
    s.cancel()
    s.mark_sent(entry)
    assert s.unsent() is not None and s.unsent().message["type"] == "utterance.done"
    s = _words(2, end=True)
    segment = s.take_segment()
    s.audio(segment, b"\x00\x01" * 10, 10)
    entry = s.unsent()
    s.sending(entry)
    assert s.requeue(segment)  # its bytes were reaching the client: the gateway must drop the socket
    s.mark_sent(entry)
    assert s.unsent() is None and s.unsent_bytes == 0


def test_a_requeue_says_whether_the_socket_attached_now_heard_part_of_the_segment():
    """After a resume, the segment's audio the new socket was sent is part of what it heard:
    `requeue` says so (the gateway then drops that socket, so its client discards that part);
    audio sent before the last resume was heard by a socket that dropped (the protocol's
    discard rule covers it), and unsent audio was heard by nobody."""
    s = _words(4)
    first = s.take_segment()
    s.audio(first, b"\x00\x01" * 10, 10)
    s.segment_done(first)
    _drain(s)
    cut = s.take_segment()
    s.audio(cut, b"\x01\x02" * 10, 10)
    _drain(s)  # heard by the first socket, which then dropped
    s.resume(1)  # the new socket starts from the cut segment's audio: not yet sent again
    s.audio(cut, b"\x02\x03" * 10, 10)
    assert not s.requeue(cut)  # nothing of it went out on the new socket
    cut = s.take_segment()
    s.audio(cut, b"\x03\x04" * 10, 10)
    s.resume(1)
    _drain(s)  # the newest socket heard the segment's start
    assert s.requeue(cut)


def test_resume_beyond_the_replay_buffer_is_refused():
    s = Session("s", SessionStart(type="session.start", max_pending_units=1), 24000, replay_bytes=65536)
    for i in range(40):
        s.delta(_delta(f"w{i} ", i))
        segment = s.take_segment()
        s.audio(segment, bytes(4000), 2000)  # 40 x 4 kB: more than the 64 kB kept
        s.segment_done(segment)
        _drain(s)
    with pytest.raises(ProtocolError):
        s.resume(0)
    s.resume(38)
    assert _drain(s)[0]["unit_start"] == 39


def test_unsent_output_does_not_use_up_the_replay_budget():
    s = Session("s", SessionStart(type="session.start", max_pending_units=1), 24000, replay_bytes=65536)
    for i in range(10):  # 10 x 4 kB sent: all of it fits the 64 kB kept
        s.delta(_delta(f"w{i} ", i))
        segment = s.take_segment()
        s.audio(segment, bytes(4000), 2000)
        s.segment_done(segment)
        _drain(s)
    for i in range(10, 40):  # then a client that stops reading: 120 kB waits unsent
        s.delta(_delta(f"w{i} ", i))
        segment = s.take_segment()
        s.audio(segment, bytes(4000), 2000)
        s.segment_done(segment)
    assert s.unsent_bytes > 65536
    s.resume(0)  # the sent history is still there to replay from
    assert _drain(s)[0]["unit_start"] == 1


def test_unsent_bytes_follow_the_log():
    s = _session(max_pending_units=1)
    s.delta(_delta("a ", 0))
    segment = s.take_segment()
    s.audio(segment, b"x" * 1000, 500)
    assert s.unsent_bytes >= 1000
    s.mark_sent()
    assert s.unsent_bytes == 0 and s.drained


messages = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=40),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text.delta", "text.flush", "text.end", "cancel", "session.end", "ping", "x"])},
        optional={"text": st.text(max_size=30), "first_unit_index": st.integers(-3, 40), "id": st.integers()},
    ).map(lambda d: __import__("json").dumps(d)),
)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, max_size=30))
def test_fuzzed_messages_give_typed_errors_and_keep_the_session_consistent(frames):
    """Any frame sequence: only ProtocolError escapes, and the unit accounting stays exact."""
    s = _session(max_pending_units=3)
    accepted_units = 0
    for raw in frames:
        try:
            message = parse_client(raw, 4096)
        except ProtocolError as exc:
            assert exc.code in {"invalid_message", "unknown_type", "binary_not_supported", "message_too_large"}
            continue
        try:
            if message.type == "text.delta":
                s.delta(message)
                accepted_units += count_units(message.text, "words")
            elif message.type == "text.flush":
                s.flush()
            elif message.type == "text.end":
                s.end()
            elif message.type == "cancel":
                s.cancel()
            elif message.type == "session.end":
                s.finish()
        except ProtocolError as exc:
            assert exc.code in {"unit_gap", "unit_overlap", "utterance_ending", "invalid_request", "text_too_long"}
        _speak_all(s)
        _drain(s)
        assert s.next_unit == accepted_units and s.unsent_bytes == 0


def test_the_committed_json_schema_is_the_codes():
    import json
    from pathlib import Path

    from voxgate.serving.wsproto import schema

    committed = json.loads((Path(__file__).parents[2] / "docs" / "protocol.schema.json").read_text())
    assert committed == json.loads(json.dumps(schema())), "run: voxgate protocol-schema > docs/protocol.schema.json"


# ---------------------------------------------------------------------- bounds (issue 16)


def test_blank_deltas_keep_one_space_and_cost_no_memory():
    s = _session()
    s.delta(_delta("Hello", 0))
    for _ in range(10_000):
        s.delta(_delta("    \t ", None))
    s.delta(_delta("world", 1))
    assert s._pending_chars == len("Hello world")
    s.flush()
    assert s.take_segment().text == "Hello world"


def test_a_blank_delta_with_a_newline_still_cuts_the_segment():
    s = _session()
    s.delta(_delta("Hello", 0))
    s.delta(_delta(" \n ", None))
    assert s.take_segment().text == "Hello"


def test_text_beyond_the_queue_bound_is_refused_and_changes_nothing():
    s = Session("s1", SessionStart(type="session.start", max_pending_units=200), 24000, text_queue_chars=300)
    index = 0
    refused = None
    for _ in range(100):
        try:
            s.delta(_delta("word ", index))
            index += 1
        except ProtocolError as exc:
            refused = exc
            break
    assert refused is not None and refused.code == "text_queue_full" and not refused.fatal
    assert refused.extra["expected_unit_index"] == index == s.next_unit
    assert s._pending_chars + s._queued_chars <= 300
    segment = s.take_segment() or (s.flush(), s.take_segment())[1]  # the engine takes the text: room again
    s.segment_done(segment)
    s.delta(_delta("word ", index))
    assert s.next_unit == index + 1


def test_text_checks_match_http():
    s = Session("s1", SessionStart(type="session.start"), 24000, max_text_chars=300)
    for text, code in (("a" * 301, "text_too_long"), ("nul\x00here", "invalid_request"), ("\x1f", "invalid_request")):
        with pytest.raises(ProtocolError) as refused:
            s.delta(_delta(text, 0))
        assert refused.value.code == code
    assert s.next_unit == 0 and not s.open


def test_no_segment_grows_past_the_text_limit():
    s = Session("s1", SessionStart(type="session.start", max_pending_units=200), 24000, max_text_chars=50)
    for i in range(40):
        s.delta(_delta("abcdefghi ", i))
    s.flush()
    texts = []
    while (segment := s.take_segment()) is not None:
        texts.append(segment.text)
        s.segment_done(segment)
    assert " ".join(texts).split() == ["abcdefghi"] * 40
    assert max(len(t) for t in texts) <= 50


def test_cancel_drops_only_the_open_utterances_unsent_entries():
    s = _session(max_pending_units=1)
    s.delta(_delta("one ", 0))
    s.end()
    _speak_all(s)  # utterance 0 logged, nothing sent yet
    before = [e.message for e in s._log]
    s.delta(_delta("two ", 1))
    segment = s.take_segment()
    s.audio(segment, b"\x00\x01" * 10, 10)
    s.cancel()
    messages = _drain(s)
    assert messages[: len(before)] == before  # the older utterance's unsent output is all kept
    assert [m["type"] for m in messages[len(before) :]] == ["utterance.done"]
    assert messages[-1]["status"] == "cancelled" and messages[-1]["utterance"] == 1


def test_many_cancels_keep_the_log_linear():
    """Each cancel answers with one utterance.done and touches only what it removes."""
    s = _session()
    for _ in range(20_000):
        s.cancel()
    assert len(s._log) == 20_000 and s.utterance == 20_000
    assert s.unsent_bytes == sum(e.size for e in s._log)


def _segments(s: Session) -> list:
    out = []
    while (segment := s.take_segment()) is not None:
        out.append(segment)
        s.segment_done(segment)
    return out


def test_an_utterance_starts_with_a_starter_and_its_segments_grow():
    s = _session()  # starter_units 3, max_pending_units 12
    words = [f"w{i} " for i in range(40)]
    for i, word in enumerate(words):
        s.delta(_delta(word, i))
    made = _segments(s)
    assert [(g.unit_start, g.unit_end) for g in made] == [(0, 2), (3, 8), (9, 20), (21, 32)]
    assert [g.starter for g in made] == [True, False, False, False]
    s.end()
    (last,) = _segments(s)
    assert (last.unit_start, last.unit_end, last.starter) == (33, 39, False)
    for i, word in enumerate(["again ", "one ", "two ", "three "]):  # the next utterance has a starter again
        s.delta(_delta(word, 40 + i))
    (again,) = _segments(s)
    assert again.starter and again.text == "again one two"


def test_the_starter_ends_at_its_first_clause_but_not_inside_a_number():
    s = _session()
    s.delta(_delta("Well, ", 0))
    (first,) = _segments(s)
    assert first.text == "Well," and first.starter
    t = _session()
    t.delta(_delta("It costs 1,", 0))  # three units: full, but the word may go on
    assert t.take_segment() is None
    t.delta(_delta("000", 3))
    assert t.take_segment() is None
    t.delta(_delta(" dollars", 4))  # now the number has ended: cut before this word
    (starter,) = _segments(t)
    assert starter.text == "It costs 1,000" and (starter.unit_start, starter.unit_end) == (0, 3)


def test_without_a_starter_the_first_segment_waits_for_a_sentence_or_the_unit_limit():
    s = _session(starter_units=0)
    for i in range(11):
        s.delta(_delta(f"w{i}, ", i))
    assert s.take_segment() is None
    s.delta(_delta("w11 ", 11))
    assert [(g.unit_start, g.unit_end) for g in _segments(s)] == [(0, 11)]


def test_a_starter_never_exceeds_max_pending_units():
    s = _session(starter_units=8, max_pending_units=5)
    for i in range(10):
        s.delta(_delta(f"w{i} ", i))
    assert [(g.unit_start, g.unit_end) for g in _segments(s)] == [(0, 4), (5, 9)]


def test_a_starved_listener_restarts_the_segment_sizes_once_and_never_cuts_inside_a_word():
    s = _session()  # starter_units 3, max_pending_units 12
    for i in range(9):  # the starter (0-2), then six words (3-8)
        s.delta(_delta(f"w{i} ", i))
    assert [(g.unit_start, g.unit_end) for g in _segments(s)] == [(0, 2), (3, 8)]
    _drain(s)
    for i in range(9, 13):  # four words of the next (12-word) segment; its listener runs dry
        s.delta(_delta(f"w{i} ", i))
    assert s.take_segment() is None
    s.starved(1.0)  # four words pending, more than a starter: spoken now
    (now,) = _segments(s)
    assert (now.unit_start, now.unit_end, now.starter) == (9, 12, False)
    _drain(s)
    s.starved(1.1)  # no segment since the restart: nothing changes
    for i in range(13, 19):  # then the schedule grows again: 3 words, then 6
        s.delta(_delta(f"w{i} ", i))
    assert [(g.unit_start, g.unit_end) for g in _segments(s)] == [(13, 15)]
    for i in range(19, 22):
        s.delta(_delta(f"w{i} ", i))
    assert [(g.unit_start, g.unit_end) for g in _segments(s)] == [(16, 21)]
    # Inside a word, a starved listener waits for the word's end, not the full segment.
    t = _session()
    for i, word in enumerate(["a ", "b ", "c ", "d ", "e ", "f ", "g ", "h ", "i "]):
        t.delta(_delta(word, i))
    _segments(t), _drain(t)
    t.delta(_delta("one two Hel", 9))
    t.starved(2.0)
    assert t.take_segment() is None  # "Hel" may go on
    t.delta(_delta("lo ", 12))
    t.delta(_delta("world ", 13))  # the cut the starved listener waited for: three words, at a word's end
    (cut,) = _segments(t)
    assert cut.text == "one two Hello" and (cut.unit_start, cut.unit_end) == (9, 12)


def test_a_listener_is_not_starved_while_audio_is_unsent_or_a_segment_is_in_flight():
    s = _session()
    for i in range(9):
        s.delta(_delta(f"w{i} ", i))
    _segments(s)  # spoken, not yet sent: the listener has more coming
    for i in range(9, 13):
        s.delta(_delta(f"w{i} ", i))
    s.starved(1.0)
    assert s.take_segment() is None
    _drain(s)
    s.starved(1.0)
    assert [(g.unit_start, g.unit_end) for g in _segments(s)] == [(9, 12)]
    u = _session(segments="utterance")  # one segment an utterance: never cut early
    for i in range(5):
        u.delta(_delta(f"w{i} ", i))
    u.starved(1.0)
    assert u.take_segment() is None


def test_a_starved_listener_cuts_at_a_clause_only_where_the_pending_text_ends_a_word():
    def starved_after(*deltas: str) -> list[str]:
        s = _session()  # starter_units 3: a clause end cuts a restarted schedule's first segment
        for i in range(9):  # the starter (0-2), then six words (3-8), heard to the end
            s.delta(_delta(f"w{i} ", i))
        _segments(s), _drain(s)
        for text in deltas:
            s.delta(_delta(text, None))
        s.starved(1.0)
        return [g.text for g in _segments(s)]

    assert starved_after("Well,", " wor") == []  # "wor" may go on ("world"): no cut inside it
    assert starved_after("Well, ") == ["Well,"]  # the clause and its word are whole: spoken now
    assert starved_after("好的，", "世") == ["好的，世"]  # beside a CJK character a cut is always at a word's end


def test_a_sentence_or_clause_cut_inside_a_delta_leaves_the_word_it_ends_inside_for_the_next():
    s = _session(starter_units=0)
    s.delta(_delta("Hi. The", 0))  # two units; "The" may go on
    s.delta(_delta("re we go. And", 2))
    s.delta(_delta(" more ", 6))
    s.end()
    got = [(g.text, g.unit_start, g.unit_end) for g in _segments(s)]
    assert got == [("Hi.", 0, 0), ("There we go.", 1, 4), ("And more", 5, 6)]
    t = _session()  # a starter ends at its first clause, not inside the word after it
    t.delta(_delta("Well, the", 0))
    t.delta(_delta("n we go ", 2))
    assert [(g.text, g.unit_start, g.unit_end) for g in _segments(t)] == [("Well,", 0, 0)]
    c = _session(starter_units=0)  # CJK punctuation needs no space after it
    c.delta(_delta("你好。The", 0))
    c.delta(_delta("re ", c.next_unit))
    c.end()
    assert [g.text for g in _segments(c)] == ["你好。", "There"]
    w = _session(starter_units=0)  # a delta that ends between words is cut whole, as before
    w.delta(_delta("Hi. How ", 0))
    assert [(g.text, g.unit_start, g.unit_end) for g in _segments(w)] == [("Hi. How", 0, 1)]


def test_a_full_stop_at_a_delta_s_end_waits_for_the_next_delta_to_say_whether_a_sentence_ended():
    s = _session(starter_units=0)
    for token in ["It", " costs", " 3", ".", "50", " now", ".", " Then"]:
        s.delta(_delta(token, s.next_unit))
        if token == ".":
            assert s.take_segment() is None  # "3." may be "3.50"
    got = [g.text for g in _segments(s)]
    assert got == ["It costs 3.50 now."]  # cut when " Then" began a word, not inside the number
    s.delta(_delta(" at 10:", s.next_unit))
    s.delta(_delta("30:", s.next_unit))
    assert s.take_segment() is None
    s.delta(_delta("\n", s.next_unit))  # a line break (or a space) after it: the end it was
    assert [g.text for g in _segments(s)] == ["Then at 10:30:"]
    t = _session(starter_units=0)
    t.delta(_delta("Done.", 0))
    t.delta(_delta("你好", 1))  # a CJK character starts a word too
    assert [g.text for g in _segments(t)] == ["Done."]
    u = _session(starter_units=0)
    u.delta(_delta("One. Two.", 0))  # the first end is certain, the last waits
    assert [g.text for g in _segments(u)] == ["One."]
    u.end()
    assert [g.text for g in _segments(u)] == ["Two."]


def _cut_texts(deltas: list[str], end: bool = True) -> list[str]:
    s = _session(starter_units=0)
    for d in deltas:
        s.delta(_delta(d, s.next_unit))
    if end:
        s.end()
    return [g.text for g in _segments(s)]


def test_an_abbreviation_s_full_stop_ends_no_segment_however_the_deltas_fall():
    # In one delta, and split at every place an LLM's tokens may split it: never "Dr." | "Lee".
    for deltas in (["Ask Dr. Lee now. Then go."], ["Ask Dr", ".", " Lee now.", " Then go."],
                   ["Ask Dr.", " ", "Lee now. ", "Then go."], ["Ask Dr. ", "Lee now. Then go."]):  # fmt: skip
        assert _cut_texts(deltas) == ["Ask Dr. Lee now.", "Then go."], deltas
    assert _cut_texts(["Use a tool, e.g. ", "the saw. ", "Done."]) == ["Use a tool, e.g. the saw.", "Done."]
    assert _cut_texts(["It is big. ", "Very big."]) == ["It is big.", "Very big."]  # no abbreviation: cut at once
    for last in ("left", "rain", "true", "it"):  # a short word ends the sentence at once: no wait for the next delta
        t = _session(starter_units=0)
        t.delta(_delta(f"Then it {last}. ", 0))
        assert [g.text for g in _segments(t)] == [f"Then it {last}."], last
    s = _session(starter_units=0)
    s.delta(_delta("See Dr. ", 0))
    assert s.take_segment() is None  # "Dr. " waits for the next word
    s.delta(_delta("\n", s.next_unit))  # a line break ends it whatever came before
    assert [g.text for g in _segments(s)] == ["See Dr."]


def _cuts(s: Session) -> list[tuple[str, int, int]]:
    out = []
    while (segment := s.take_segment()) is not None:
        out.append((segment.text, segment.unit_start, segment.unit_end))
        s.segment_done(segment)
    return out


@pytest.mark.parametrize(
    "text",
    [
        "Keep talking about nothing in particular. " * 7,  # sentences in one delta
        " ".join(f"word{i}" for i in range(50)) + " ",  # no sentence end at all
        "我们今天去公园散步然后一起吃午饭再回家休息一下晚上看电影" * 2,  # one CJK run
        "Dr. Lee came at 3.50 p.m. today, and then, well, he left; nobody knew why. " * 3,  # held marks
    ],
)
@pytest.mark.parametrize("starter", [0, 3])
def test_a_long_delta_is_cut_as_if_it_had_been_streamed_a_unit_at_a_time(text, starter):
    """One delta holding many units gets no segment past the pending limit (a single segment of
    it sent no units.done for longer than the replay buffer holds, so a dropped client could not
    resume), and the cuts are the ones its units streamed one by one get."""
    whole = _session(max_pending_units=12, starter_units=starter)
    whole.delta(_delta(text, 0))
    whole.end()
    streamed = _session(max_pending_units=12, starter_units=starter)
    starts = [u.start for u in split_units(text)][1:]
    pieces = [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)], strict=True)]
    at = 0
    for piece in pieces:
        streamed.delta(_delta(piece, at))
        at += count_units(piece, "words")
    streamed.end()
    cuts = _cuts(whole)
    assert cuts == _cuts(streamed)
    assert len(cuts) > 1 and all(end - start + 1 <= 12 for _, start, end in cuts)
    assert [c[1] for c in cuts] == [0] + [c[2] + 1 for c in cuts[:-1]] and cuts[-1][2] == count_units(text, "words") - 1
    assert "".join(c[0] for c in cuts).replace(" ", "") == text.replace(" ", "")
