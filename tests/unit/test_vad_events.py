"""The VAD's turn-taking rules on scripted speech probabilities (no model)."""

from __future__ import annotations

import pytest

from voxgate.agent.vad import SpeechEnded, SpeechStarted, VadConfig, VadSegmenter
from voxgate.types import InvalidRequest

W = 512  # samples per 32 ms window at 16 kHz
SILENT, VOICED = 0.02, 0.93
HANGOVER_W = 7  # 200 ms rounded up to windows: 7 x 32 ms = 224 ms
MIN_SPEECH_W = 8  # 250 ms -> 8 windows
PRE_ROLL = 3200  # 200 ms at 16 kHz


def script(*runs: tuple[float, int]) -> list[float]:
    """(probability, windows) runs -> one probability per window."""
    return [p for p, n in runs for _ in range(n)]


def run(probs: list[float], config: VadConfig | None = None, flush: bool = True) -> list:
    seg = VadSegmenter(config)
    events = seg.push_many(probs)
    return events + (seg.flush() if flush else [])


def test_one_utterance_starts_after_min_speech_with_pre_roll_and_ends_after_hangover():
    events = run(script((SILENT, 20), (VOICED, 30), (SILENT, 20)))
    assert events == [
        SpeechStarted(sample=(20 + MIN_SPEECH_W) * W, start_sample=20 * W - PRE_ROLL),
        SpeechEnded(sample=(50 + HANGOVER_W) * W, start_sample=20 * W - PRE_ROLL, end_sample=50 * W),
    ]
    end = events[1]
    assert end.end_s == pytest.approx(1.6) and end.time_s - end.end_s == pytest.approx(0.224)


def test_end_of_turn_waits_the_whole_hangover():
    seg = VadSegmenter()
    assert len(seg.push_many(script((VOICED, 20)))) == 1
    assert seg.push_many(script((SILENT, HANGOVER_W - 1))) == []
    assert seg.in_speech
    (end,) = seg.push(SILENT)
    assert isinstance(end, SpeechEnded) and end.sample - end.end_sample == HANGOVER_W * W
    assert not seg.in_speech


def test_hangover_is_configurable():
    events = run(script((VOICED, 20), (SILENT, 40)), VadConfig(hangover_ms=500))
    assert events[1].sample - events[1].end_sample == 16 * W  # 500 ms -> 16 windows (512 ms)


def test_short_cough_is_ignored():
    assert run(script((SILENT, 10), (VOICED, MIN_SPEECH_W - 1), (SILENT, 30))) == []


def test_voice_not_yet_speech_is_heard_until_it_is_confirmed_or_dropped():
    seg = VadSegmenter()
    seg.push_many(script((SILENT, 5), (VOICED, MIN_SPEECH_W - 1)))
    assert seg.hearing_voice and not seg.in_speech  # the agent holds an unheard reply meanwhile
    seg.push(VOICED)
    assert seg.in_speech and not seg.hearing_voice
    seg.push_many(script((SILENT, 20), (VOICED, 2), (SILENT, HANGOVER_W)))
    assert not seg.hearing_voice and not seg.in_speech  # a click: dropped after the hangover


def test_min_speech_is_configurable():
    probs = script((SILENT, 10), (VOICED, 4), (SILENT, 30))
    assert run(probs, VadConfig(min_speech_ms=100))[0] == SpeechStarted(14 * W, 10 * W - PRE_ROLL)
    assert run(probs, VadConfig(min_speech_ms=200)) == []


def test_pause_shorter_than_hangover_stays_one_utterance():
    events = run(script((VOICED, 15), (SILENT, HANGOVER_W - 1), (VOICED, 15), (SILENT, 20)))
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded]
    assert events[1].end_sample == (15 + HANGOVER_W - 1 + 15) * W


def test_two_utterances_give_two_turns():
    events = run(script((SILENT, 10), (VOICED, 20), (SILENT, 30), (VOICED, 12), (SILENT, 10)))
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded, SpeechStarted, SpeechEnded]
    assert (events[0].start_sample, events[1].end_sample) == (10 * W - PRE_ROLL, 30 * W)
    assert (events[2].start_sample, events[3].end_sample) == (60 * W - PRE_ROLL, 72 * W)


def test_pre_roll_never_reaches_into_the_previous_utterance_or_before_the_stream():
    config = VadConfig(pre_roll_ms=500)
    events = run(script((SILENT, 2), (VOICED, 10), (SILENT, 8), (VOICED, 10), (SILENT, 10)), config)
    assert events[0].start_sample == 0  # 500 ms before sample 1024 is before the stream
    assert events[2].start_sample == events[1].end_sample == 12 * W


def test_cough_before_speech_within_hangover_joins_the_utterance():
    events = run(script((SILENT, 10), (VOICED, 3), (SILENT, 3), (VOICED, 10), (SILENT, 10)))
    assert events[0] == SpeechStarted(sample=(10 + MIN_SPEECH_W) * W, start_sample=10 * W - PRE_ROLL)


def test_hysteresis_keeps_speech_between_the_thresholds_but_does_not_start_it():
    middling = 0.42  # below threshold 0.5, above its default release 0.35
    assert run(script((middling, 40))) == []
    events = run(script((VOICED, 10), (middling, 20), (0.3, 10)))
    assert events[1].end_sample == 30 * W


def test_flush_closes_open_speech_and_drops_a_candidate():
    seg = VadSegmenter()
    seg.push_many(script((VOICED, 12), (SILENT, 3)))
    assert seg.flush() == [SpeechEnded(sample=15 * W, start_sample=0, end_sample=12 * W)]
    seg.push_many(script((VOICED, 3)))
    assert seg.flush() == []
    assert seg.position == 18 * W


def test_reset_starts_a_new_stream_at_sample_zero():
    seg = VadSegmenter()
    seg.push_many(script((VOICED, 12)))
    seg.reset()
    assert not seg.in_speech and seg.position == 0
    assert seg.push_many(script((VOICED, MIN_SPEECH_W)))[0].sample == MIN_SPEECH_W * W


@pytest.mark.parametrize(
    "kwargs",
    [{"threshold": 0.0}, {"threshold": 1.5}, {"release_threshold": 0.8}, {"hangover_ms": -1}, {"min_speech_ms": -5}],
)
def test_bad_config_is_a_typed_error(kwargs):
    with pytest.raises(InvalidRequest):
        VadConfig(**kwargs)
