"""EnginePool: engine calls most urgent first, then earliest deadline, then in order."""

import asyncio
import threading
import time

import numpy as np
import pytest

from voxgate.speech import stream as stream_module
from voxgate.speech.clock import PlaybackClock
from voxgate.speech.stream import BATCH_BUDGET_S, EngineStream
from voxgate.speech.workers import HOLD_SLACK_S, EnginePool
from voxgate.types import AudioChunk, EngineFailure, SynthesisRequest

REQUEST = SynthesisRequest(text="x", voice="v")


def _blocked(pool: EnginePool) -> threading.Event:
    """Occupy the pool's only worker until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(5)

    pool.submit(hold)
    assert started.wait(5)
    return release


def test_waiting_calls_run_by_priority_then_deadline_then_in_order():
    pool = EnginePool(1)
    release = _blocked(pool)
    ran: list[str] = []
    futures = [
        pool.submit_at(3.0, 0, ran.append, "late"),
        pool.submit_at(1.0, 0, ran.append, "early"),
        pool.submit_at(2.0, 0, ran.append, "middle-a"),
        pool.submit_at(2.0, 0, ran.append, "middle-b"),
        pool.submit_at(99.0, 50, ran.append, "urgent"),
        pool.submit_at(0.0, -1, ran.append, "background"),
    ]
    assert pool.waiting == 6
    release.set()
    for future in futures:
        future.result(5)
    assert ran == ["urgent", "early", "middle-a", "middle-b", "late", "background"]
    pool.shutdown()


def test_a_call_failing_reaches_its_future_and_the_worker_goes_on():
    pool = EnginePool(1)

    def boom() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        pool.submit(boom).result(5)
    assert pool.submit(lambda: 7).result(5) == 7
    pool.shutdown()


def test_calls_that_wait_do_not_hold_up_others_while_workers_remain():
    pool = EnginePool(4)
    release = threading.Event()
    waiting = [pool.submit(release.wait, 5) for _ in range(3)]
    assert pool.submit(lambda: "quick").result(2) == "quick"
    release.set()
    assert all(f.result(5) for f in waiting)
    pool.shutdown()


def test_shutdown_cancels_waiting_calls_and_refuses_new_ones():
    pool = EnginePool(1)
    release = _blocked(pool)
    queued = pool.submit(lambda: None)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(lambda: None)
    release.set()


def test_keyword_arguments_and_run_in_executor_work():
    pool = EnginePool(2)
    assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(5) == 3

    async def main() -> int:
        return await asyncio.get_running_loop().run_in_executor(pool, sum, [1, 2, 3])

    assert asyncio.run(main()) == 6
    pool.shutdown()


def _open_stream(pool: EnginePool, ran: list[str], name: str):
    return pool.submit_at(time.perf_counter(), 0, ran.append, name, opens_stream=True)


def test_while_streams_keep_starting_calls_with_audio_in_hand_wait_for_them():
    pool = EnginePool(1)
    pool.hold_s = 2.0  # the checks below need no more than this between them, even on a busy machine
    release = _blocked(pool)
    ran: list[str] = []

    def run_ahead() -> float:
        ran.append("ahead")
        return time.perf_counter()

    first = _open_stream(pool, ran, "first")
    ahead = pool.submit_at(time.perf_counter() + 60, 0, run_ahead)  # a minute of audio in hand
    release.set()
    first.result(5)
    assert ran == ["first"]  # "ahead" is held: a stream started less than hold_s ago
    t_new = time.perf_counter()
    _open_stream(pool, ran, "new").result(5)  # another stream's first call goes first
    assert ran == ["first", "new"]
    started = ahead.result(10)  # once no stream has started for hold_s
    assert ran == ["first", "new", "ahead"]
    assert started - t_new >= pool.hold_s
    pool.shutdown()


def test_a_held_call_still_starts_before_its_deadline():
    pool = EnginePool(1)
    pool.hold_s = 30.0
    _open_stream(pool, [], "a stream started: hold for 30 s").result(5)
    t0 = time.perf_counter()
    started = pool.submit_at(t0 + 1.0, 0, time.perf_counter).result(5)
    # it left the time to new streams: all but HOLD_SLACK_S and twice the longest recent call
    # (microseconds here, which a busy machine can stretch: it must still hold half the second)...
    assert started - t0 >= 1.0 - HOLD_SLACK_S - 0.44
    assert started - t0 < 5.0  # ...until its deadline came near, not for the whole hold
    pool.shutdown()


def test_a_slow_engine_s_held_calls_start_earlier_by_twice_its_longest_call():
    pool = EnginePool(1)
    pool.hold_s = 30.0
    pool.submit(time.sleep, 1.0).result(5)  # calls take up to a second
    _open_stream(pool, [], "a stream started").result(5)
    t0 = time.perf_counter()
    started = pool.submit_at(t0 + 3.0, 0, time.perf_counter).result(5)
    assert 0.5 < started - t0 < 2.5  # held, but started ~2 s (not 60 ms) before it is needed
    pool.shutdown()


def test_without_new_streams_calls_run_at_once_however_far_their_deadline():
    pool = EnginePool(1)
    pool.hold_s = 30.0
    pool.submit(lambda: None).result(5)  # a plain call due now (a stream closing, say) opens nothing
    t0 = time.perf_counter()
    assert pool.submit_at(t0 + 60, 0, time.perf_counter).result(5) - t0 < 5.0
    pool.shutdown()


def test_a_due_call_passes_a_held_call_of_higher_priority_and_shutdown_runs_held_calls():
    pool = EnginePool(1)
    pool.hold_s = 30.0
    release = _blocked(pool)
    ran: list[str] = []
    held = pool.submit_at(time.perf_counter() + 60, 50, ran.append, "live turn, far ahead")
    _open_stream(pool, ran, "new stream")
    release.set()
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == ["new stream"]
    pool.shutdown()  # drains what is held, at once
    assert held.done() and ran == ["new stream", "live turn, far ahead"]


class SecondsEngine:
    """Each chunk is `seconds` (one by default) of silent audio."""

    name = "seconds"
    sample_rate = 100

    def __init__(self, seconds: int = 1) -> None:
        self.seconds = seconds

    def stream(self, request, cancel):
        for i in range(3):
            yield AudioChunk(np.zeros(100 * self.seconds, dtype=np.float32), self.sample_rate, i)


class RecordingPool(EnginePool):
    """A one-worker pool that records the deadline, priority and opening flag of each call."""

    def __init__(self) -> None:
        super().__init__(1)
        self.calls: list[tuple[float, int]] = []
        self.opens: list[bool] = []

    def submit_at(self, deadline, priority, fn, *args, opens_stream=False):
        self.calls.append((deadline, priority))
        self.opens.append(opens_stream)
        return super().submit_at(deadline, priority, fn, *args, opens_stream=opens_stream)


def test_stream_deadlines_are_now_for_the_first_chunk_then_when_the_audio_runs_out():
    pool = RecordingPool()

    async def main() -> tuple[list[tuple[float, int]], float, float, float]:
        t0 = time.perf_counter()
        stream = EngineStream(SecondsEngine(), SynthesisRequest(text="x", voice="v", priority=50), pool)
        await stream.next()
        t_first = stream.clock.end - 1.0  # the clock ends a second (the first chunk) after it
        await stream.next()
        t1 = time.perf_counter()
        return pool.calls, t0, t_first, t1

    calls, t0, t_first, t1 = asyncio.run(main())
    assert pool.opens[:3] == [True, False, False]  # only the first call opens the stream (what a hold waits for)
    (d0, _), (d1, _), (d2, _) = calls[:3]
    assert t0 <= d0 <= t1  # the first chunk is due at once
    assert d1 == pytest.approx(t_first + 1.0)  # the second when the first second of audio has played
    assert d2 == pytest.approx(t_first + 2.0)
    assert all(priority == 50 for _, priority in calls)


class PlayAtEngine(SecondsEngine):
    """Records each request's `play_at`."""

    def __init__(self) -> None:
        super().__init__()
        self.play_at: list[float | None] = []

    def stream(self, request, cancel):
        self.play_at.append(request.play_at)
        return super().stream(request, cancel)


def test_a_sessions_later_segment_is_due_when_the_audio_before_it_runs_out():
    """One listener, two segments: the second's first call, and the engine's `play_at`, come
    from the listener's clock (what the transport sent), not from the segment's own start."""
    pool, engine = RecordingPool(), PlayAtEngine()
    clock = PlaybackClock()

    async def main() -> float:
        first = EngineStream(engine, REQUEST, pool, clock=clock)
        while (chunk := await first.next()) is not None:
            clock.add(chunk.duration_s, time.perf_counter())  # the transport sends it
        assert clock.sent_s == 3.0
        later = EngineStream(engine, REQUEST, pool, clock=clock)
        await later.next()
        later.cancel("done")
        return clock.end

    end = asyncio.run(main())
    first_play_at, later_play_at = engine.play_at
    assert first_play_at is not None and first_play_at <= pool.calls[0][0] + 1e-9  # a new utterance: due now
    second_call = pool.calls[4]  # three chunks and the end of the first stream, then the second's first call
    assert pool.opens[4] and second_call[0] == pytest.approx(later_play_at)
    assert later_play_at == end and end >= first_play_at + 3.0  # 3 s sent: due when they have played


def test_the_playback_clock_waits_through_gaps():
    clock = PlaybackClock()
    assert clock.due(5.0) == 5.0 and clock.buffered(5.0) == 0.0
    clock.add(2.0, 10.0)
    clock.add(1.0, 10.5)  # queued behind the first piece
    assert clock.end == 13.0 and clock.due(11.0) == 13.0 and clock.buffered(11.0) == 2.0
    assert clock.due(20.0) == 13.0  # starved: it was needed at 13
    clock.add(1.0, 20.0)  # after the gap, playback goes on from now
    assert clock.end == 21.0 and clock.buffered(25.0) == 0.0 and clock.sent_s == 4.0
    assert clock.wait_s(20.5, 0.3) == 0.2 and clock.wait_s(20.9, 0.3) == 0.0  # pacing: at most 0.3 s in hand
    clock.reset()
    assert clock.due(30.0) == 30.0 and clock.buffered(30.0) == 0.0 and clock.sent_s == 0.0


def test_a_new_streams_first_chunk_goes_before_a_buffered_streams_next_one():
    async def main() -> list[str]:
        pool = EnginePool(1)
        ahead = EngineStream(SecondsEngine(60), REQUEST, pool)  # a minute: a busy machine cannot make it due
        await asyncio.wait_for(asyncio.shield(ahead._pending), 5)  # its first chunk is made
        release = _blocked(pool)
        await ahead.next()  # and its second is queued, due a minute after the first was ready
        order: list[str] = []
        ahead._pending.add_done_callback(lambda _: order.append("ahead"))
        newcomer = EngineStream(SecondsEngine(), REQUEST, pool)
        newcomer._pending.add_done_callback(lambda _: order.append("new"))
        release.set()
        await ahead.next()
        await newcomer.next()
        await asyncio.sleep(0)
        return order

    assert asyncio.run(main()) == ["new", "ahead"]


class TenthsEngine:
    """Ten chunks of 0.1 s, chunk i covering unit i; `fail_at` raises instead of that chunk;
    each chunk after the first takes `delay_s` to make."""

    name = "tenths"
    sample_rate = 100

    def __init__(self, fail_at: int | None = None, delay_s: float = 0.0) -> None:
        self.fail_at, self.delay_s = fail_at, delay_s

    def stream(self, request, cancel):
        for i in range(10):
            if i == self.fail_at:
                raise RuntimeError("boom")
            if i:
                time.sleep(self.delay_s)
            yield AudioChunk(np.full(10, i, dtype=np.float32), self.sample_rate, i, i, i + 1)


def _batched_pool(batch_s: float) -> EnginePool:
    pool = EnginePool(1)
    pool.batch_s = batch_s
    return pool


@pytest.fixture
def no_batch_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call stops joining chunks after `BATCH_BUDGET_S` (5 ms), which a busy machine can spend
    between two instant chunks: tests of how much audio a call joins lift it (it has its own test)."""
    monkeypatch.setattr(stream_module, "BATCH_BUDGET_S", 60.0)


@pytest.mark.usefixtures("no_batch_budget")
def test_a_batching_pool_sends_the_first_chunk_alone_then_joins_later_ones():
    async def main() -> list[AudioChunk]:
        stream = EngineStream(TenthsEngine(), REQUEST, _batched_pool(0.35))
        chunks = []
        while (chunk := await stream.next()) is not None:
            chunks.append(chunk)
        return chunks

    chunks = asyncio.run(main())
    assert [len(c.samples) for c in chunks] == [10, 40, 40, 10]  # 0.1 s, then up to 0.35 s a call
    assert [(c.unit_start, c.unit_end) for c in chunks] == [(0, 1), (1, 5), (5, 9), (9, 10)]
    assert np.concatenate([c.samples for c in chunks]).tolist() == np.repeat(np.arange(10), 10).tolist()


@pytest.mark.usefixtures("no_batch_budget")
def test_a_failure_inside_a_batch_comes_after_the_audio_made_before_it():
    async def main() -> tuple[list[int], str]:
        stream = EngineStream(TenthsEngine(fail_at=3), REQUEST, _batched_pool(1.0))
        sizes = []
        try:
            while (chunk := await stream.next()) is not None:
                sizes.append(len(chunk.samples))
        except EngineFailure as exc:
            return sizes, exc.message
        return sizes, ""

    sizes, message = asyncio.run(main())
    assert sizes == [10, 20]  # chunk 0 alone, then 1-2 before the failure at 3
    assert "boom" in message


def test_a_call_stops_joining_chunks_once_its_time_budget_is_spent():
    async def main() -> list[AudioChunk]:
        # every chunk takes 4x the budget: a call makes one, may start a second, and stops
        stream = EngineStream(TenthsEngine(delay_s=4 * BATCH_BUDGET_S), REQUEST, _batched_pool(1.0))
        chunks = []
        while (chunk := await stream.next()) is not None:
            chunks.append(chunk)
        return chunks

    chunks = asyncio.run(main())
    assert len(chunks[0].samples) == 10 and all(len(c.samples) <= 20 for c in chunks)  # 1.0 s would be all 9
    assert np.concatenate([c.samples for c in chunks]).tolist() == np.repeat(np.arange(10), 10).tolist()


def test_more_urgent_waiting_compares_priority_then_deadline():
    pool = EnginePool(1)
    assert not pool.more_urgent_waiting(0, 5.0)
    release = _blocked(pool)
    pool.submit_at(5.0, 0, lambda: None)
    assert pool.more_urgent_waiting(0, 6.0)
    assert not pool.more_urgent_waiting(0, 4.0)
    assert not pool.more_urgent_waiting(50, 99.0)  # a live turn is never held back by other work
    release.set()
    pool.shutdown()
