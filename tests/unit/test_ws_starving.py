"""The gateway's synthesiser wakes when its listener starts starving, not at its next poll."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from voxgate.serving.ws import STARVING_S, Gateway
from voxgate.speech.clock import PlaybackClock

NOW = 1000.0


def _live(buffered_s: float | None, attached: bool = True) -> SimpleNamespace:
    clock = PlaybackClock()
    if buffered_s is not None:
        clock.add(buffered_s, NOW)
    return SimpleNamespace(socket=object() if attached else None, clock=clock)


def test_the_synthesiser_sleeps_only_until_its_listener_would_start_starving():
    # 0.3 s in hand: wake when 0.15 s is left (the cut starving allows, made at once), not after
    # the 0.2 s poll and then maybe a delta's wait: at 5 words a second the listener would run dry.
    for buffered in (0.3, 0.2):
        assert Gateway._next_check(_live(buffered), 5.0, NOW) == pytest.approx(buffered - STARVING_S + 0.001)


def test_the_synthesiser_polls_as_before_where_starving_cannot_come_sooner():
    assert Gateway._next_check(_live(10.0), 5.0, NOW) == 0.2  # far ahead: the poll comes first
    assert Gateway._next_check(_live(10.0), 0.05, NOW) == 0.05  # the idle flush comes first
    assert Gateway._next_check(_live(None), 5.0, NOW) == 0.2  # no audio yet
    assert Gateway._next_check(_live(1.0, attached=False), 5.0, NOW) == 0.2  # nobody listens
    assert Gateway._next_check(_live(0.05), 5.0, NOW) == 0.2  # already starving: no busy loop
