"""The qwen3 prompt thread: every request's prompt built on one thread, in batches, with each
asker getting its own result or its own typed error."""

from __future__ import annotations

import threading

import pytest

from voxgate.engines.qwen3.prompt_thread import PromptThread
from voxgate.types import UnknownVoice


def test_each_asker_gets_its_own_result_and_waiting_requests_are_built_in_one_batch():
    entered, gate, batches, current = threading.Event(), threading.Event(), [], []

    def make(text: str) -> str:
        if text == "first":
            entered.set()
            gate.wait(10)  # holds the thread while the others queue up
        if text == "bad":
            raise UnknownVoice("no such voice")
        current.append(threading.current_thread().name)
        return text.upper()

    worker = PromptThread(make, None)
    build = worker._build
    worker._build = lambda batch: (batches.append(len(batch)), build(batch))  # type: ignore[method-assign]
    results: dict[str, object] = {}

    def ask(text: str) -> None:
        try:
            results[text] = worker.build(text)
        except UnknownVoice as exc:
            results[text] = exc

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    assert entered.wait(10)  # the thread has taken "first" alone and is blocked in make()
    others = [threading.Thread(target=ask, args=(t,)) for t in ("a", "bad", "b", "c")]
    for t in others:
        t.start()
    while worker._queue.qsize() < 4:
        threading.Event().wait(0.001)
    gate.set()
    for t in [first, *others]:
        t.join(10)
    worker.close()
    assert {k: v for k, v in results.items() if k != "bad"} == {"first": "FIRST", "a": "A", "b": "B", "c": "C"}
    assert isinstance(results["bad"], UnknownVoice)  # typed, to its asker only
    assert set(current) == {"qwen3-prompts"} and batches == [1, 4]  # the four that waited: one batch
    with pytest.raises(RuntimeError):
        worker.build("late")
