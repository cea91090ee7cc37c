import hashlib

import numpy as np

from voxgate.engines.base import collect
from voxgate.engines.tone import SAMPLE_RATE, ToneEngine, unit_samples, unit_tone
from voxgate.types import CancelToken, SynthesisRequest


def _request(text: str, **kw) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice="tone", **kw)


def test_length_follows_the_text_units():
    engine = ToneEngine(unit_ms=100)
    audio = collect(engine, _request("one two three 四五"))
    assert len(audio.samples) == 5 * SAMPLE_RATE // 10


def test_speed_scales_duration():
    engine = ToneEngine(unit_ms=100)
    assert len(collect(engine, _request("a b c d", speed=2.0)).samples) == 4 * unit_samples(100, 2.0)


def test_chunks_carry_contiguous_unit_ranges():
    engine = ToneEngine(units_per_chunk=2)
    chunks = list(engine.stream(_request("a b c d e"), CancelToken()))
    assert [(c.unit_start, c.unit_end) for c in chunks] == [(0, 2), (2, 4), (4, 5)]
    assert [c.seq for c in chunks] == [0, 1, 2]


def test_same_text_gives_identical_audio_and_different_text_differs():
    engine = ToneEngine()
    digest = {hashlib.sha256(collect(engine, _request("same words")).samples.tobytes()).hexdigest() for _ in range(5)}
    assert len(digest) == 1
    assert not np.array_equal(
        collect(engine, _request("same words")).samples, collect(engine, _request("other words")).samples
    )


def test_cancel_stops_between_chunks():
    engine = ToneEngine()
    token = CancelToken()
    stream = engine.stream(_request("a b c d e f"), token)
    next(stream)
    token.cancel("test")
    assert list(stream) == []


def test_delay_wakes_immediately_on_cancel():
    import threading
    import time

    engine = ToneEngine(delay_ms=5000)
    token = CancelToken()
    threading.Timer(0.05, token.cancel).start()
    t0 = time.perf_counter()
    assert list(engine.stream(_request("a b"), token)) == []
    assert time.perf_counter() - t0 < 2


def test_unit_tones_are_cached_read_only_and_chunks_are_fresh_arrays():
    tone = unit_tone("cached", 480, 1.0)
    assert unit_tone("cached", 480, 1.0) is tone and not tone.flags.writeable
    chunk = next(ToneEngine().stream(_request("cached"), CancelToken()))
    assert chunk.samples.flags.writeable and not np.shares_memory(chunk.samples, unit_tone("cached", 2880, 1.0))
