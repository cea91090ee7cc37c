"""The agent's outbound track without a network: framing, tags, end markers, flush, pts."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

import numpy as np
import pytest

from voxgate.agent.frames import FRAME_SAMPLES, RATE, FrameQueue
from voxgate.agent.webrtc import OutboundAudio
from voxgate.types import InvalidRequest


def tone(seconds: float, rate: int, freq: float = 440.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def drain(q: FrameQueue, ticks: int) -> list:
    return [q.pop() for _ in range(ticks)]


def test_48k_audio_is_cut_into_exact_20ms_frames_carrying_their_tag() -> None:
    q = FrameQueue()
    audio = tone(0.1, RATE)
    q.enqueue(audio, RATE, "a")
    assert len(q) == 5 and q.queued_s == pytest.approx(0.1)
    frames = [tick.frame for tick in drain(q, 5)]
    assert all(f.tag == "a" and f.samples == FRAME_SAMPLES and f.pcm.dtype == np.int16 for f in frames)
    joined = np.concatenate([f.pcm for f in frames]).astype(np.float32) / 32767
    np.testing.assert_allclose(joined, audio, atol=1 / 32767)


def test_chunk_tails_wait_for_the_next_chunk_and_end_pads_the_last_frame() -> None:
    q = FrameQueue()
    audio = tone(0.05, RATE)  # 2.5 frames, sent in odd pieces
    for piece in np.array_split(audio, 7):
        q.enqueue(piece, RATE, "a")
    assert len(q) == 2  # the half frame is held, not padded mid-stream
    q.end("a")
    ticks = drain(q, 3)
    assert [t.frame.samples for t in ticks] == [FRAME_SAMPLES, FRAME_SAMPLES, FRAME_SAMPLES // 2]
    assert not ticks[2].frame.pcm[FRAME_SAMPLES // 2 :].any()  # zero padding
    assert ticks[2].drained_after == ["a"] and ticks[1].drained_after == []


def test_resampled_stream_keeps_its_duration_and_frequency() -> None:
    q = FrameQueue()
    audio = tone(1.0, 24000, freq=1000.0)
    for piece in np.array_split(audio, 13):  # engine-sized chunks through one stateful resampler
        q.enqueue(piece, 24000, "reply")
    q.end("reply")
    frames = [t.frame for t in drain(q, len(q))]
    assert sum(f.samples for f in frames) == RATE
    pcm = np.concatenate([f.pcm for f in frames]).astype(np.float32)
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    assert np.argmax(spectrum) * RATE / len(pcm) == pytest.approx(1000.0, abs=2.0)


def test_int16_input_is_accepted_and_bad_input_is_refused() -> None:
    q = FrameQueue()
    q.enqueue(np.full(FRAME_SAMPLES, 1000, dtype=np.int16), RATE, "a")
    assert q.pop().frame.pcm[0] == 1000
    with pytest.raises(InvalidRequest, match="mono"):
        q.enqueue(np.zeros((2, 960), dtype=np.float32), RATE, "a")
    with pytest.raises(InvalidRequest, match="sample rate"):
        q.enqueue(np.zeros(960, dtype=np.float32), 0, "a")
    with pytest.raises(InvalidRequest, match="int16"):
        q.enqueue(np.zeros(960, dtype=np.int32), RATE, "a")


def test_a_new_tag_closes_the_previous_tags_audio_in_order() -> None:
    q = FrameQueue()
    q.enqueue(tone(0.03, RATE), RATE, "a")  # 1.5 frames
    q.enqueue(tone(0.02, RATE), RATE, "b")
    q.end("b")
    tags = [(t.frame.tag, t.frame.samples) for t in drain(q, 3)]
    assert tags == [("a", FRAME_SAMPLES), ("a", FRAME_SAMPLES // 2), ("b", FRAME_SAMPLES)]


def test_end_is_a_barrier_for_the_open_stream_whatever_its_tag() -> None:
    q = FrameQueue()
    q.enqueue(tone(0.03, RATE), RATE, ("reply", 0))  # segment tags, then the reply's end
    q.end("reply")
    q.enqueue(tone(0.02, RATE), RATE, ("next", 0))
    ticks = drain(q, 3)
    assert [(t.frame.tag, t.frame.samples) for t in ticks] == [
        (("reply", 0), FRAME_SAMPLES), (("reply", 0), FRAME_SAMPLES // 2), (("next", 0), FRAME_SAMPLES)
    ]  # fmt: skip
    assert ticks[1].drained_after == ["reply"]


def test_end_marker_after_everything_was_published_drains_on_the_next_tick() -> None:
    q = FrameQueue()
    q.enqueue(tone(0.02, RATE), RATE, "a")
    first = q.pop()
    assert first.frame.tag == "a" and first.drained_after == []
    q.end("a")
    q.enqueue(tone(0.02, RATE), RATE, "b")
    tick = q.pop()
    assert tick.drained_before == ["a"] and tick.frame.tag == "b"
    assert q.pop().frame is None  # then silence


def test_flush_all_drops_frames_markers_and_the_held_partial() -> None:
    q = FrameQueue()
    q.enqueue(tone(0.1, RATE), RATE, "a")
    q.end("a")
    q.enqueue(tone(0.05, RATE), RATE, "b")  # 2 frames + a held half
    assert q.flush() == 5 + 2 + 1
    assert len(q) == 0 and q.queued_s == 0
    ticks = drain(q, 3)
    assert all(t.frame is None and not t.drained_before and not t.drained_after for t in ticks)


def test_flush_by_tag_keeps_other_tags_and_their_markers() -> None:
    q = FrameQueue()
    q.enqueue(tone(0.04, RATE), RATE, "a")
    q.end("a")
    q.enqueue(tone(0.06, RATE), RATE, "b")
    q.end("b")
    assert q.flush("a") == 2
    ticks = drain(q, 4)
    assert [t.frame.tag if t.frame else None for t in ticks] == ["b", "b", "b", None]
    assert ticks[2].drained_after == ["b"]
    assert all("a" not in t.drained_before + t.drained_after for t in ticks)
    assert q.flush("missing") == 0


def test_flush_of_the_open_tag_restarts_its_stream() -> None:
    q = FrameQueue()
    q.enqueue(tone(0.03, RATE), RATE, "a")
    assert q.flush("a") == 2  # one whole frame and the held half
    q.enqueue(tone(0.02, RATE), RATE, "a")
    assert len(q) == 1 and q.pop().frame.samples == FRAME_SAMPLES


async def _recv_frames(track: OutboundAudio, n: int) -> tuple[list, list[float]]:
    """`n` frames, and the clock before the first `recv` then after each one. Timed from before
    the first call: the track's clock starts inside it, and a busy machine can hold this
    coroutine before it notes the first frame's return, so timing from there could only shrink."""
    frames, times = [], [time.perf_counter()]
    for _ in range(n):
        frames.append(await track.recv())
        times.append(time.perf_counter())
    return frames, times


def test_track_frames_have_continuous_pts_and_silence_when_empty() -> None:
    published: list[tuple] = []
    drained: list[tuple] = []
    track = OutboundAudio(on_published=lambda *a: published.append(a), on_drained=lambda *a: drained.append(a))
    track.enqueue(tone(0.03, RATE), RATE, "hello")
    track.end("hello")
    frames, times = asyncio.run(_recv_frames(track, 4))
    assert [f.pts for f in frames] == [0, 960, 1920, 2880]
    for f in frames:
        assert (f.sample_rate, f.samples, f.format.name, f.time_base) == (RATE, FRAME_SAMPLES, "s16", Fraction(1, RATE))
        left, right = f.to_ndarray().reshape(-1, 2).T
        np.testing.assert_array_equal(left, right)
    assert not frames[2].to_ndarray().any() and not frames[3].to_ndarray().any()
    assert [(tag, round(s, 4)) for tag, s, _ in published] == [("hello", 0.02), ("hello", 0.01)]
    assert len(drained) == 1 and drained[0][0] == "hello" and drained[0][1] == published[-1][2]
    assert times[-1] - times[0] >= 3 * 0.02 - 0.003  # paced (frame 4 is due 60 ms after frame 1), not pulled at once


def test_flush_during_the_wait_silences_the_very_next_frame() -> None:
    """The flush comes 5 ms into the 20 ms that `recv` sleeps until its frame's slot. A busy
    machine can hold this coroutine past a slot (that `recv` then takes its frame at once,
    without a wait), so the flush lands in the wait of a later `recv`: which one is read from
    the frames published when it ran. Every frame taken after it is silence, none before."""
    track = OutboundAudio()
    track.enqueue(tone(1.0, RATE), RATE, "reply")

    async def run() -> tuple[tuple[int, int], list]:
        await track.recv()
        loop = asyncio.get_running_loop()
        flushed = loop.create_future()
        loop.call_later(0.005, lambda: flushed.set_result((track.published, track.flush())))  # while recv sleeps
        frames = [await track.recv() for _ in range(10)]
        return await flushed, frames

    (published, dropped), frames = asyncio.run(run())
    assert 1 <= published <= 10  # it came while one of these recv calls waited for its slot
    assert dropped == 50 - published  # one second is 50 frames; those published before it stay out
    loud = [bool(f.to_ndarray().any()) for f in frames]  # frames[i] is the frame published (i + 1)th
    assert loud == [True] * (published - 1) + [False] * (11 - published)


def test_a_failing_callback_does_not_stop_the_track() -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("callback bug")

    track = OutboundAudio(on_published=boom, on_drained=boom)
    track.enqueue(tone(0.02, RATE), RATE, "a")
    track.end("a")
    frames, _ = asyncio.run(_recv_frames(track, 2))
    assert len(frames) == 2


def test_a_held_track_sends_silence_and_keeps_its_queue_for_after() -> None:
    published: list[tuple] = []
    track = OutboundAudio(on_published=lambda *a: published.append(a))
    track.enqueue(tone(0.04, RATE), RATE, "reply")
    track.hold(True)
    held, _ = asyncio.run(_recv_frames(track, 3))
    assert not any(f.to_ndarray().any() for f in held) and published == []  # silence, nothing of the reply
    track.hold(False)
    after, _ = asyncio.run(_recv_frames(track, 2))
    assert all(f.to_ndarray().any() for f in after)  # the whole reply, from its start
    assert [(tag, round(s, 4)) for tag, s, _ in published] == [("reply", 0.02), ("reply", 0.02)]
