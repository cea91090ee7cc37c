"""The reply pipeline with the real tone engine behind real engine streams; the LLM side is a
scripted stream of text deltas (the input, not a stand-in for any part under test)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from voxgate.bridge.pipeline import ReplyPipeline, heard_text
from voxgate.bridge.segmenter import Segment
from voxgate.config import Settings
from voxgate.engines.registry import create_engine
from voxgate.speech.stream import EngineStream
from voxgate.speech.workers import EnginePool
from voxgate.types import AudioChunk, SynthesisRequest

REPLY = "Sure, here it is. The first sentence is short. Then a second one follows it. And the last one ends."


async def _deltas(text: str, pause: float | None = 0.005, fail_after: int | None = None) -> AsyncIterator[str]:
    """The text word by word, `pause` s apart; `pause=None`: all at once (the producer takes
    every word in one go, before the consumer runs again)."""
    for i, word in enumerate(text.split(" ")):
        if fail_after is not None and i == fail_after:
            raise ConnectionError("the LLM went away")
        yield word + " "
        if pause is not None:
            await asyncio.sleep(pause)


class Synth:
    """Engine streams of the tone engine, with a log of when each was opened."""

    def __init__(self) -> None:
        self.engine = create_engine("tone", Settings(engine="tone", tone_delay_ms=2))
        self.executor = EnginePool(8)
        self.voice = self.engine.voices()[0].id
        self.streams: list[EngineStream] = []
        self.log: list[tuple[str, str]] = []

    def __call__(self, segment: Segment) -> EngineStream:
        self.log.append(("open", segment.text))
        stream = EngineStream(self.engine, SynthesisRequest(text=segment.text, voice=self.voice), self.executor)
        self.streams.append(stream)
        return stream


def test_segments_are_spoken_in_order_and_the_next_one_is_synthesised_early():
    synth = Synth()

    async def run() -> tuple[ReplyPipeline, list[str]]:
        pipeline = ReplyPipeline(synth)
        order = []
        # the whole reply is known before the first chunk is out, so the overlap does not depend
        # on how fast the engine's thread runs against the loop (word by word, it would race)
        async for segment, _chunk in pipeline.run(_deltas(REPLY, pause=None)):
            synth.log.append(("chunk", segment.text))
            if not order or order[-1] != segment.text:
                order.append(segment.text)
        return pipeline, order

    pipeline, order = asyncio.run(run())
    assert " ".join(order).split() == REPLY.split() and pipeline.spoken().split() == REPLY.split()
    assert order[0] == "Sure," and pipeline.stats.segments == len(order)
    last_chunk = {text: i for i, (what, text) in enumerate(synth.log) if what == "chunk"}
    for previous, text in itertools.pairwise(order):  # overlap: opened while the previous was handed out
        assert synth.log.index(("open", text)) < last_chunk[previous]


def test_a_segment_with_nothing_to_say_costs_no_engine_call():
    synth = Synth()

    async def run() -> ReplyPipeline:
        pipeline = ReplyPipeline(synth)
        async for _segment, _chunk in pipeline.run(_deltas("Great job on the release today! 🎉🎉🎉", pause=None)):
            pass
        return pipeline

    pipeline = asyncio.run(run())
    assert [text for what, text in synth.log if what == "open"] == ["Great job", "on the release today!"]
    assert pipeline.stats.unspeakable == 1 and pipeline.stats.segments == 2


def test_cancel_stops_within_a_chunk_and_reports_what_was_spoken():
    synth = Synth()

    async def run() -> tuple[ReplyPipeline, int]:
        pipeline = ReplyPipeline(synth)
        chunks = 0
        async for segment, _chunk in pipeline.run(_deltas(REPLY)):
            chunks += 1
            if segment.text.startswith("The first"):
                pipeline.cancel()
        return pipeline, chunks

    pipeline, _ = asyncio.run(run())
    assert pipeline.spoken() == "Sure, here it is. The first sentence is short."  # the cut segment counts
    assert all(stream.token.cancelled for stream in synth.streams)


class Unstoppable:
    """A stream whose first chunk is at once and whose next ones take 30 s and cannot be cut
    short, as Piper's whole-sentence synthesis (a long one: waiting for it cannot pass unseen)."""

    def __init__(self, segment: Segment) -> None:
        self.left = 3

    async def next(self) -> AudioChunk | None:
        if self.left < 3:
            await asyncio.shield(asyncio.sleep(30))
        self.left -= 1
        return AudioChunk(np.zeros(100, np.float32), 24000) if self.left >= 0 else None

    def cancel(self, reason: str) -> None:
        pass


def test_cancel_ends_the_reply_at_once_even_with_a_chunk_in_flight():
    async def run() -> float:
        pipeline = ReplyPipeline(Unstoppable)
        loop = asyncio.get_running_loop()
        async for _segment, _chunk in pipeline.run(_deltas(REPLY)):
            loop.call_later(0.05, pipeline.cancel)  # while the next chunk is being made
        return time.perf_counter() - pipeline.stopped_at

    assert asyncio.run(run()) < 5  # not the rest of the 30 s chunk in flight (5 s: a busy machine)


def test_latest_drops_stale_main_segments_but_keeps_the_first_and_the_last():
    synth = Synth()

    async def run() -> tuple[ReplyPipeline, list[str]]:
        pipeline = ReplyPipeline(synth, policy="latest")
        spoken: list[str] = []
        async for segment, _chunk in pipeline.run(_deltas(REPLY, pause=0)):
            if not spoken or spoken[-1] != segment.text:
                spoken.append(segment.text)
            await asyncio.sleep(0.02)  # a slow listener
        return pipeline, spoken

    pipeline, spoken = asyncio.run(run())
    assert spoken[0] == "Sure," and spoken[-1].endswith("ends.")
    assert pipeline.stats.dropped >= 1 and len(spoken) == pipeline.stats.segments


def test_an_llm_failure_mid_reply_speaks_what_came_then_raises():
    synth = Synth()

    async def run(pipeline: ReplyPipeline) -> None:
        async for _ in pipeline.run(_deltas(REPLY, fail_after=9)):
            pass

    pipeline = ReplyPipeline(synth)
    with pytest.raises(ConnectionError):
        asyncio.run(run(pipeline))
    assert pipeline.spoken().startswith("Sure, here it is. The first sentence is short.")


def test_heard_text_counts_whole_segments_then_the_played_share_of_the_cut_one():
    spans = [("Sure,", 0.4), ("here is the plan for today.", 2.0), ("好的，我们开始吧。", 1.0)]
    assert heard_text(spans, 0) == ""
    assert heard_text(spans, 0.39) == ""
    assert heard_text(spans, 0.4) == "Sure,"
    assert heard_text(spans, 0.4 + 1.0) == "Sure, here is the"  # 6 words, half of them
    assert heard_text(spans, 2.4 + 0.5) == "Sure, here is the plan for today. 好的，我"  # 7 units, 3 played
    assert heard_text(spans, 99) == "Sure, here is the plan for today. 好的，我们开始吧。"
