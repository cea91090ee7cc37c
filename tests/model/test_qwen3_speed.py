"""qwen3 speaks at its own pace (`native_speed = False`): another speaking rate, asked through
any transport (they all call `stream_pieces`), is the same speech time-stretched."""

from __future__ import annotations

import numpy as np
import pytest

from voxgate.engines.base import stream_pieces
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.engine import Qwen3Engine
from voxgate.types import CancelToken, NotSupported, SynthesisRequest

TEXT = "A short sentence to speak at another rate."


@pytest.fixture(scope="module")
def engine(ours):
    engine = Qwen3Engine(ours["cv06"], sampling=SamplingParams.greedy(max_new_tokens=16, min_new_tokens=16))
    yield engine
    engine.close()


def _samples(engine, speed: float) -> int:
    request = SynthesisRequest(text=TEXT, voice="vivian", language="en", speed=speed)
    return sum(len(c.samples) for c in stream_pieces(engine, request, CancelToken()))


@pytest.mark.parametrize("speed", [0.75, 1.5])
def test_another_rate_is_the_same_speech_stretched(engine, speed):
    normal = _samples(engine, 1.0)  # greedy, fixed length: the same codes at every rate
    assert abs(_samples(engine, speed) - normal / speed) <= max(0.01 * normal / speed, 600)  # 1 %, or atempo's 25 ms


def test_the_engine_itself_still_refuses_a_rate_asked_directly(engine):
    request = SynthesisRequest(text=TEXT, voice="vivian", language="en", speed=1.5)
    with pytest.raises(NotSupported):
        list(engine.stream(request, CancelToken()))
    assert not np.isnan(_samples(engine, 1.0))
