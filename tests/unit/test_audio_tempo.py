"""Speaking rate by time-stretch (`audio_tempo.TempoStretch`, FFmpeg's atempo) and the engines
that use it (`engines.base.stream_pieces` for an engine without `native_speed`)."""

from __future__ import annotations

import numpy as np
import pytest

from voxgate.audio_tempo import TempoStretch
from voxgate.engines.base import stream_pieces
from voxgate.engines.tone import ToneEngine
from voxgate.text import count_units
from voxgate.types import CancelToken, SynthesisRequest

RATE = 24000
WINDOW = RATE // 40  # 25 ms: atempo's overlap window, what its output may differ by whatever the length


def _tone(seconds: float) -> np.ndarray:
    return (0.3 * np.sin(np.arange(int(RATE * seconds)) / RATE * 2 * np.pi * 220)).astype(np.float32)


@pytest.mark.parametrize("factor", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_the_audio_lasts_its_length_over_the_factor_and_comes_as_it_streams(factor):
    stretch, x = TempoStretch(factor, RATE), _tone(3.0)
    outs = [stretch.process(x[i : i + 1920]) for i in range(0, len(x), 1920)]
    tail = stretch.flush()
    total = sum(len(o) for o in outs) + len(tail)
    assert abs(total - len(x) / factor) <= max(0.01 * len(x) / factor, WINDOW)
    assert sum(len(o) for o in outs[:5]) > 0  # audio out while audio still goes in
    assert stretch.flush().size == 0  # flushed once


def test_the_pitch_is_kept():
    stretch = TempoStretch(2.0, RATE)
    out = np.concatenate([stretch.process(_tone(2.0)), stretch.flush()])
    spectrum = np.abs(np.fft.rfft(out[RATE // 4 : RATE // 4 + RATE // 2]))
    assert abs(np.argmax(spectrum) * RATE / (RATE // 2) - 220) <= 4  # still 220 Hz, twice as fast


@pytest.mark.parametrize("factor", [0.2, 4.5])
def test_a_factor_out_of_range_is_refused(factor):
    with pytest.raises(ValueError):
        TempoStretch(factor, RATE)


class PacedTone(ToneEngine):
    """The tone engine as an engine that cannot change its pace (as qwen3)."""

    native_speed = False


def test_an_engine_without_native_speed_is_stretched_and_keeps_its_units():
    text = "one two three four five six seven eight"
    normal = list(stream_pieces(ToneEngine(), SynthesisRequest(text=text, voice="tone"), CancelToken()))
    fast = list(stream_pieces(PacedTone(), SynthesisRequest(text=text, voice="tone", speed=2.0), CancelToken()))
    n, f = sum(len(c.samples) for c in normal), sum(len(c.samples) for c in fast)
    assert abs(f - n / 2) <= max(0.01 * n, WINDOW)
    assert [c.seq for c in fast] == list(range(len(fast)))
    assert fast[0].unit_start == 0 and max(c.unit_end for c in fast) == count_units(text)
    native = list(stream_pieces(ToneEngine(), SynthesisRequest(text=text, voice="tone", speed=2.0), CancelToken()))
    assert sum(len(c.samples) for c in native) == n // 2  # an engine with its own pace is not stretched
