"""One thread that builds the talker prompts of all requests, many at a time.

Measured on an H200 (BENCHMARKS.md, issue 17): a prompt takes 0.45 ms to build alone, but when
64 streams start together, each on its own worker thread, each build takes 49-53 ms p50:
the 64 threads take turns at the GIL and at the side CUDA stream they share, and each waits
on the host for the GPU work the others queued before it. Here the requests queue up and
one thread builds every prompt waiting, then waits for the GPU once for the whole batch, and
hands each result (or the typed error its request raised) back to the thread that asked.

Off by default (`VOXGATE_QWEN3_PROMPT_THREAD`) until a same-machine A/B on a GPU says it
helps: the switch is the A/B.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

MAX_BATCH = 64  # prompts built before one wait for the GPU


class PromptThread:
    """`build(*args)` runs `make(*args)` on the thread, under `stream` when there is one."""

    def __init__(self, make: Callable[..., Any], stream: torch.cuda.Stream | None) -> None:
        self._make, self._stream = make, stream
        self._queue: queue.SimpleQueue[tuple[tuple[Any, ...], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="qwen3-prompts", daemon=True)
        self._closed = False
        self._thread.start()

    def build(self, *args: Any) -> Any:
        """The prompt for `args`, built on the thread; raises what building it raised."""
        if self._closed:
            raise RuntimeError("the prompt thread is closed")
        done: Future[Any] = Future()
        self._queue.put((args, done))
        return done.result()

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # seen again after this batch: the loop ends
                    break
                batch.append(more)
            self._build(batch)

    def _build(self, batch: list[tuple[tuple[Any, ...], Future[Any]]]) -> None:
        made: list[tuple[Future[Any], Any]] = []
        try:
            with torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext():
                for args, done in batch:
                    try:
                        made.append((done, self._make(*args)))
                    except BaseException as exc:  # the asker's error (unknown voice, text too long, ...)
                        done.set_exception(exc)
            if self._stream is not None:
                self._stream.synchronize()  # once for the whole batch
        except BaseException as exc:  # the GPU failed: every asker hears it
            for done, _ in made:
                done.set_exception(exc)
            return
        for done, result in made:
            done.set_result(result)
