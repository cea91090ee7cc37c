"""When a gateway listener starves: the moment the synthesiser wakes for it, and the threshold,
which follows how long segments take to start."""

from __future__ import annotations

import pytest

from voxgate.serving.ws import STARVING_S, next_check, until_starving
from voxgate.speech.clock import PlaybackClock, StartWatch

NOW = 1000.0
THRESHOLD = 0.15


def _clock(buffered_s: float | None) -> PlaybackClock:
    clock = PlaybackClock()
    if buffered_s is not None:
        clock.add(buffered_s, NOW)
    return clock


def test_the_synthesiser_sleeps_only_until_its_listener_would_start_starving():
    # 0.3 s in hand: wake when 0.15 s is left (the cut starving allows, made at once), not after
    # the 0.2 s poll and then maybe a delta's wait: at 5 words a second the listener would run dry.
    for buffered in (0.3, 0.2):
        wait = next_check(_clock(buffered), True, 5.0, NOW, THRESHOLD)
        assert wait == pytest.approx(buffered - THRESHOLD + 0.001)
    assert next_check(_clock(0.5), True, 5.0, NOW, 0.4) == pytest.approx(0.101)  # a higher threshold: sooner


def test_the_synthesiser_polls_as_before_where_starving_cannot_come_sooner():
    assert next_check(_clock(10.0), True, 5.0, NOW, THRESHOLD) == 0.2  # far ahead: the poll comes first
    assert next_check(_clock(10.0), True, 0.05, NOW, THRESHOLD) == 0.05  # the idle flush comes first
    assert next_check(_clock(None), True, 5.0, NOW, THRESHOLD) == 0.2  # no audio yet
    assert next_check(_clock(1.0), False, 5.0, NOW, THRESHOLD) == 0.2  # nobody listens
    assert next_check(_clock(0.05), True, 5.0, NOW, THRESHOLD) == 0.2  # already starving: no busy loop


def test_the_starving_threshold_follows_the_recent_worst_segment_start_within_its_bounds():
    floor, ceiling = STARVING_S
    watch = StartWatch(floor, ceiling)
    assert watch.threshold() == floor  # nothing seen: an idle machine's
    watch.note(0.01)  # tone on a CPU
    assert watch.threshold() == floor
    watch.note(0.12)  # a burst of starts on a busy GPU: twice it
    assert watch.threshold() == pytest.approx(0.24)
    watch.note(0.02)
    assert watch.threshold() == pytest.approx(2 * 0.12 * 0.95)  # a slow start is forgotten gradually
    for _ in range(100):
        watch.note(0.02)
    assert watch.threshold() == floor  # ... and then gone
    watch.note(5.0)  # a start behind a long queue
    assert watch.threshold() == ceiling
    with pytest.raises(ValueError):
        StartWatch(0.0, 1.0)


def test_until_starving_says_how_far_a_listener_is_from_the_line():
    assert until_starving(_clock(0.5), True, NOW, THRESHOLD) == pytest.approx(0.35)
    assert until_starving(_clock(0.1), True, NOW, THRESHOLD) < 0  # starving now
    assert until_starving(_clock(None), True, NOW, THRESHOLD) is None  # no audio yet
    assert until_starving(_clock(0.1), False, NOW, THRESHOLD) is None  # nobody listens
