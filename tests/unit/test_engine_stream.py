"""EngineStream: the asyncio driver of a synchronous engine stream."""

import asyncio
import threading
import time

import numpy as np
import pytest

from voxgate.speech.stream import EngineStream
from voxgate.speech.workers import EnginePool
from voxgate.types import AudioChunk, Busy, EngineFailure, SynthesisRequest

REQUEST = SynthesisRequest(text="x", voice="v")


class CountingEngine:
    """A protocol-conforming engine that records how far it got and whether it was closed."""

    name = "counting"
    sample_rate = 1000

    def __init__(self, chunks: int, delay_s: float = 0.0, fail_at: int | None = None) -> None:
        self.chunks, self.delay_s, self.fail_at = chunks, delay_s, fail_at
        self.produced = 0
        self.closed = threading.Event()

    def voices(self):
        return []

    def warmup(self):
        return None

    def close(self):
        return None

    def stream(self, request, cancel):
        try:
            for i in range(self.chunks):
                if cancel.cancelled:
                    return
                time.sleep(self.delay_s)
                if i == self.fail_at:
                    raise RuntimeError("boom")
                self.produced += 1
                yield AudioChunk(np.zeros(10, dtype=np.float32), self.sample_rate, i)
        finally:
            self.closed.set()


def _run(coro):
    return asyncio.run(coro)


async def _seqs(stream: EngineStream) -> list[int]:
    """Every chunk's seq, read to the stream's end."""
    seqs = []
    while (chunk := await stream.next()) is not None:
        seqs.append(chunk.seq)
    return seqs


def test_streams_every_chunk_in_order():
    async def main():
        engine = CountingEngine(5)
        stream = EngineStream(engine, REQUEST, EnginePool(2))
        return await _seqs(stream), stream.generated

    assert _run(main()) == ([0, 1, 2, 3, 4], 5)


def test_cancel_wastes_at_most_the_chunk_in_flight_and_closes_the_engine():
    async def main():
        engine = CountingEngine(100, delay_s=0.02)
        stream = EngineStream(engine, REQUEST, EnginePool(2))
        await stream.next()
        await stream.next()
        stream.cancel("client_disconnect")
        assert await stream.next() is None
        await asyncio.sleep(0.2)
        return engine

    engine = _run(main())
    assert engine.closed.wait(10)  # the close runs on a worker thread: generous for a busy machine
    assert engine.produced <= 3  # two consumed + the one in flight at cancel


def test_engine_exception_becomes_engine_failure():
    async def main():
        stream = EngineStream(CountingEngine(5, fail_at=1), REQUEST, EnginePool(2))
        await stream.next()
        with pytest.raises(EngineFailure, match="RuntimeError: boom"):
            await stream.next()
        assert await stream.next() is None

    _run(main())


def test_lazy_stream_does_no_work_until_started_and_closes_if_never_started():
    async def main():
        engine = CountingEngine(5)
        stream = EngineStream(engine, REQUEST, EnginePool(2), start=False)
        await asyncio.sleep(0.05)
        assert engine.produced == 0
        assert (await stream.next()).seq == 0
        idle = CountingEngine(5)
        closed = threading.Event()
        EngineStream(idle, REQUEST, EnginePool(1), on_closed=closed.set, start=False).cancel("gone")
        await asyncio.sleep(0.05)
        return idle, closed

    idle, closed = _run(main())
    assert closed.wait(10) and idle.produced == 0  # the close runs on the pool's thread: wait for it


def test_a_polled_pool_reads_an_engine_without_a_polled_path_on_threads():
    """`EnginePool.polled` only changes engines that offer `open_polled`: this one is read as
    before, every chunk in order, and closed when done."""

    async def main(polled: bool):
        engine, pool = CountingEngine(5), EnginePool(2)
        pool.polled = polled
        stream = EngineStream(engine, REQUEST, pool)
        seqs = await _seqs(stream)
        stream.cancel("done")
        assert await asyncio.to_thread(engine.closed.wait, 10)
        return seqs, stream.generated, stream.exhausted

    assert _run(main(True)) == _run(main(False)) == ([0, 1, 2, 3, 4], 5, True)


def test_a_loop_waker_sets_every_event_with_one_call_into_the_loop_per_round():
    """Wakes that come before the loop runs again share one callback (a runner handing many
    streams their frames wakes their loop once); every event is set; a later wake schedules anew."""
    from voxgate.speech.stream import LoopWaker

    async def main():
        loop = asyncio.get_running_loop()
        calls = []
        real = loop.call_soon_threadsafe

        def counting(*args):
            calls.append(args)
            return real(*args)

        loop.call_soon_threadsafe = counting  # the plain asyncio loop takes an instance attribute
        waker = LoopWaker(loop)
        for round_ in (1, 2):
            events = [asyncio.Event() for _ in range(50)]
            for event in events:  # no await between them: the loop cannot run the callback yet
                waker.wake(event)
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 10)
            assert ours(calls, waker) == round_
        done = asyncio.Event()
        await asyncio.to_thread(waker.wake, done)  # from another thread, as the runner calls it
        await asyncio.wait_for(done.wait(), 10)
        assert ours(calls, waker) == 3

    def ours(calls, waker):  # to_thread hands its result back through the same method
        return sum(1 for args in calls if getattr(args[0], "__self__", None) is waker)

    _run(main())


class PolledEngine(CountingEngine):
    """An engine with a polled path whose open is quick (`opens_at_once`, when set): its source
    hands out `chunks` chunks from a thread of its own, waking the reader after each."""

    def __init__(self, chunks: int, at_once: bool, refuse: bool = False) -> None:
        super().__init__(chunks)
        self.opens_at_once, self.refuse = at_once, refuse
        self.opened_on: int | None = None

    def open_polled(self, request, cancel, wake):
        self.opened_on = threading.get_ident()
        if self.refuse:
            raise Busy("the engine's queue is full")
        source = ListSource()

        def feed():
            for i in range(self.chunks):
                source.put(AudioChunk(np.zeros(10, dtype=np.float32), self.sample_rate, i))
                wake()
            source.put(None)
            wake()

        threading.Thread(target=feed, daemon=True).start()
        return source


class ListSource:
    def __init__(self) -> None:
        self.ended, self._items, self._lock = False, [], threading.Lock()

    def put(self, item) -> None:
        with self._lock:
            self._items.append(item)

    def poll(self):
        with self._lock:
            items, self._items = self._items, []
        if None in items:
            self.ended = True
        return [i for i in items if i is not None]

    def close(self) -> None:
        return None


@pytest.mark.parametrize("at_once", [True, False])
def test_an_engine_that_opens_at_once_is_opened_on_the_event_loop_and_read_the_same(at_once):
    """`Engine.opens_at_once`: the stream's open runs on the loop's own thread (no worker is
    started for it); without it, on a worker. Either way every chunk comes, in order, and a
    refusal at the open reaches the reader as the same typed error."""

    async def main(refuse: bool):
        engine, pool = PolledEngine(4, at_once, refuse), EnginePool(2)
        pool.polled = True
        stream = EngineStream(engine, REQUEST, pool)
        try:
            seqs = await _seqs(stream)
        finally:
            stream.cancel("done")
        return seqs, engine.opened_on == threading.get_ident(), len(pool._threads)

    seqs, on_loop, workers = _run(main(refuse=False))
    assert seqs == [0, 1, 2, 3] and on_loop is at_once and (workers == 0) is at_once
    with pytest.raises(Busy, match="queue is full"):
        _run(main(refuse=True))


def test_an_engine_that_opens_at_once_without_a_polled_stream_is_read_on_a_worker():
    """`opens_at_once` with `open_polled` giving None (no polled path for this request): the
    stream is read the threaded way, its chunks made on a worker, never on the event loop."""

    class NoSource(CountingEngine):
        opens_at_once = True

        def open_polled(self, request, cancel, wake):
            return None

        def stream(self, request, cancel):
            self.made_on = threading.get_ident()
            yield from super().stream(request, cancel)

    async def main():
        engine, pool = NoSource(3), EnginePool(2)
        pool.polled = True
        stream = EngineStream(engine, REQUEST, pool)
        return await _seqs(stream), engine.made_on != threading.get_ident()

    assert _run(main()) == ([0, 1, 2], True)
