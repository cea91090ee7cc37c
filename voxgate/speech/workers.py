"""`EnginePool`: the threads that run engine calls, most urgent call first.

A plain thread pool runs calls in the order they were submitted, and with a thread per
stream it runs all of them at once, so under a burst the first chunk of a new utterance
waits behind (or shares the GIL with) later chunks of utterances whose listeners already
have seconds of audio buffered. This pool orders waiting calls by

1. priority: higher first (a request's `priority`; the voice agent's live turn is high);
2. deadline: when the listener needs the result. A stream's first chunk is needed now;
   a later chunk at the time the audio already produced runs out (see `EngineStream`),
   which for a stream ahead of real time lies in the future. Earliest deadline first
   starves nobody: a stream that falls behind gets a past deadline and goes ahead;
3. submission order.

With `workers` bounded (an engine that computes in the calling thread: a CPU engine
declares `parallel_calls`), the order is the order of execution. Such a pool may also
`hold_s`: while new streams keep starting (a stream's first call arrived within `hold_s`),
a call not due for a while waits, until `HOLD_SLACK_S` plus twice the longest recent call
before its deadline (so a slow engine still makes it in time). A burst of
new streams is admitted by the event loop one at a time; without the hold the workers fill
the gaps with audio for streams that have plenty, and take the CPU (and the GIL) from the
loop that is still handing over the new streams' first calls. With one worker per
stream (engines whose calls mostly wait, e.g. the batched GPU engine), the order only
matters when all workers are busy. It is a `concurrent.futures.Executor`, so plain
`submit` (deadline now, priority 0) and `loop.run_in_executor` work too.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from voxgate.engines.base import DEFAULT_MAX_PIECE_CHARS

HOLD_SLACK_S = 0.06  # a held call still starts this long (plus twice the longest recent call) before its deadline


class EnginePool(Executor):
    def __init__(self, workers: int, name: str = "voxgate-engine") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.batch_s = 0.0  # audio one stream call may make in a go (`EngineStream`); 0 = one chunk a call
        self.hold_s = 0.0  # calls with slack wait while streams keep starting this often; 0 = never
        self.max_piece_chars = DEFAULT_MAX_PIECE_CHARS  # longest text one engine call gets (`EngineStream`)
        self.polled = False  # streams of engines with `open_polled` are read without a thread each (`EngineStream`)
        self._last_opened = float("-inf")  # when a stream's first call last arrived
        self._longest_call = 0.0  # seconds, decaying by a tenth a call
        self._name = name
        self._heap: list[tuple[int, float, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if kwargs:
            return self.submit_at(time.perf_counter(), 0, lambda: fn(*args, **kwargs))
        return self.submit_at(time.perf_counter(), 0, fn, *args)

    def submit_at(
        self, deadline: float, priority: int, fn: Callable[..., Any], /, *args: Any, opens_stream: bool = False
    ) -> Future[Any]:
        """Run `fn(*args)` on a worker, after every waiting call of higher priority or due earlier.
        `opens_stream`: the first call of a stream (while those arrive, calls with slack are held)."""
        future: Future[Any] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            entry = (-priority, deadline, next(self._order), future, fn, args)
            heapq.heappush(self._heap, entry)
            if opens_stream:
                self._last_opened = time.perf_counter()
            if self._idle:
                self._ready.notify()  # a woken worker counts as idle until it runs, hence:
            if len(self._heap) > self._idle and len(self._threads) < self.workers:
                self._start_worker()
        return future

    def more_urgent_waiting(self, priority: int, deadline: float) -> bool:
        """Whether a queued call would run before one submitted now with this priority and deadline."""
        heap = self._heap
        try:
            head = heap[0]
        except IndexError:
            return False
        return (head[0], head[1]) < (-priority, deadline)

    @property
    def waiting(self) -> int:
        """Calls queued, not yet started."""
        return len(self._heap)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                for entry in self._heap:
                    entry[3].cancel()
                self._heap.clear()
            self._ready.notify_all()
        if wait:
            for thread in list(self._threads):
                thread.join()

    def _start_worker(self) -> None:
        thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _take(self) -> tuple[int | None, float | None]:
        """The heap index of the call to run now, else how long to wait (None: until woken)."""
        heap = self._heap
        if not heap:
            return None, None
        now = time.perf_counter()
        quiet_in = self._last_opened + self.hold_s - now
        if quiet_in <= 0 or self._shutdown:
            return 0, None
        slack = HOLD_SLACK_S + 2 * self._longest_call
        due = [i for i, entry in enumerate(heap) if entry[1] - now <= slack]  # held: the rest
        if due:
            return min(due, key=heap.__getitem__), None
        return None, min(min(entry[1] for entry in heap) - slack - now, quiet_in)

    def _pop(self, index: int) -> tuple[Any, ...]:
        heap = self._heap
        if index == 0:
            return heapq.heappop(heap)
        entry = heap[index]
        heap[index] = heap[-1]
        heap.pop()
        heapq.heapify(heap)
        return entry

    def _work(self) -> None:
        took = 0.0
        while True:
            with self._lock:
                self._longest_call = max(took, 0.9 * self._longest_call)
                index, wait = self._take()
                while index is None and not (self._shutdown and not self._heap):
                    self._idle += 1
                    self._ready.wait(wait)
                    self._idle -= 1
                    index, wait = self._take()
                if index is None:
                    return  # shut down and drained
                *_, future, fn, args = self._pop(index)
            if not future.set_running_or_notify_cancel():
                continue
            started = time.perf_counter()
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)
            took = time.perf_counter() - started
            del future, fn, args  # drop references to the finished call while waiting
