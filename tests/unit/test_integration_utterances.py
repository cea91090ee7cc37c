"""The integrations' wire bookkeeping (`voxgate.integrations.utterances`), with no sockets:
scripted events in, the messages a client must send out."""

from __future__ import annotations

from voxgate.integrations.utterances import Utterances
from voxgate.integrations.wire import MAX_DELTA_CHARS, socket_url


def _texts(messages: list[dict]) -> list[str]:
    return [m.get("text", m["type"]) for m in messages]


def test_a_word_split_across_tokens_goes_out_whole():
    u = Utterances()
    out = u.say("a", " Hel") + u.start_next() + u.say("a", "lo wor") + u.say("a", "ld, and") + u.end("a")
    assert _texts(out) == [" Hello ", "world, ", "and", "text.end"]
    assert "".join(m["text"] for m in out if m["type"] == "text.delta") == " Hello world, and"


def test_cjk_text_goes_out_at_once_and_control_characters_become_spaces():
    u = Utterances()
    u.say("a", "你好")
    assert _texts(u.start_next()) == ["你好"]
    assert _texts(u.say("a", "\x00ok")) == []  # "ok" may go on
    assert _texts(u.end("a")) == [" ok", "text.end"]


def test_long_text_is_cut_between_words_into_deltas_within_the_limit():
    u = Utterances()
    u.say("a", "word " * 500)
    u.end("a")
    deltas = [m["text"] for m in u.start_next() if m["type"] == "text.delta"]
    assert len(deltas) > 1 and all(len(d) <= MAX_DELTA_CHARS for d in deltas)
    assert "".join(deltas) == "word " * 500 and all(d.endswith(" ") for d in deltas)


def test_a_second_context_waits_for_the_first_utterance_done_and_audio_follows_numbers():
    u = Utterances()
    u.say("a", "one two ")
    u.start_next()
    assert _texts(u.end("a")) == ["text.end"]
    assert u.say("b", "three four ") == [] and u.end("b") == []  # the server refuses text until done
    assert u.start_next() == [] and u.context_of(0) == "a"
    u.done(0, "completed")
    assert u.take_closed() == ["a"]
    assert _texts(u.start_next()) == ["three four ", "text.end"] and u.context_of(1) == "b"


def test_a_context_that_speaks_ends_the_open_utterance_of_another_which_closes_later():
    u = Utterances()
    u.say("a", "first part ")
    u.start_next()
    assert _texts(u.say("b", "aside ")) == ["text.end"]  # "a" is open: it ends here, not closed
    u.done(0, "completed")
    assert u.take_closed() == []
    assert _texts(u.start_next()) == ["aside "]
    u.end("b")
    u.say("a", "second part ")  # "a" goes on after "b"
    u.end("a")
    u.done(1, "completed")
    assert u.take_closed() == ["b"]
    assert _texts(u.start_next()) == ["second part ", "text.end"]
    u.done(2, "completed")
    assert u.take_closed() == ["a"]


def test_a_dropped_utterance_is_cancelled_and_its_late_audio_has_no_context():
    u = Utterances()
    u.say("a", "long reply ")
    u.start_next()
    u.end("a")
    assert u.drop("a") == [{"type": "cancel"}] and u.context_of(0) is None
    u.say("b", "next ")
    assert u.start_next() == []  # the cancel's answer says which number comes next
    u.done(0, "completed")  # "a" had completed before the cancel: its done, then the answer
    assert u.start_next() == []
    u.done(1, "cancelled")
    assert _texts(u.start_next()) == ["next "] and u.context_of(2) == "b"


def test_a_cancel_of_an_open_utterance_numbers_the_next_after_it():
    u = Utterances()
    u.say("a", "some words ")
    u.start_next()
    assert u.drop("a") == [{"type": "cancel"}]
    u.say("b", "more ")
    u.done(0, "cancelled")
    assert _texts(u.start_next()) == ["more "] and u.context_of(1) == "b"


def test_a_context_with_nothing_sent_is_dropped_without_a_cancel():
    u = Utterances()
    u.say("a", "Hel")
    assert u.start_next() == [] and u.drop("a") == []
    u.say("b", "hi ")
    assert _texts(u.start_next()) == ["hi "] and u.context_of(0) == "b"


def test_ending_a_context_with_nothing_left_closes_it_now():
    u = Utterances()
    assert u.end("gone") == [] and u.take_closed() == ["gone"]


def test_the_socket_url_comes_from_the_server_s_address():
    assert socket_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/v1/tts/ws"
    assert socket_url("https://tts.example/v1/") == "wss://tts.example/v1/tts/ws"
