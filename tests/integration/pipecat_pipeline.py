"""A real pipecat pipeline around one processor, for the pipecat integration tests:
`Recorder -> processor -> Recorder`, driven by a script that queues frames and waits on what
comes out (events, never sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pipecat.frames.frames import EndFrame, Frame, TTSAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner


class Recorder(FrameProcessor):
    """Passes every frame on and records those going its way, in order; `until` waits on them."""

    def __init__(self, direction: FrameDirection) -> None:
        super().__init__()
        self.direction = direction
        self.frames: list[Frame] = []
        self._changed = asyncio.Condition()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            async with self._changed:
                self.frames.append(frame)
                self._changed.notify_all()
        await self.push_frame(frame, direction)

    async def until(self, predicate: Callable[[list[Frame]], bool], timeout: float = 30.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self.frames)), timeout)

    def audio(self, context_id: str | None = None) -> list[TTSAudioRawFrame]:
        return [f for f in self.frames if isinstance(f, TTSAudioRawFrame) and context_id in (None, f.context_id)]


Script = Callable[[PipelineWorker, Recorder, Recorder], Awaitable[None]]


async def run_pipeline(tts: FrameProcessor, script: Script, sample_rate: int = 24000) -> tuple[Recorder, Recorder]:
    """A pipeline `up -> tts -> down`; `script` queues frames (and waits on what comes out)."""
    up, down = Recorder(FrameDirection.UPSTREAM), Recorder(FrameDirection.DOWNSTREAM)
    worker = PipelineWorker(Pipeline([up, tts, down]), params=PipelineParams(audio_out_sample_rate=sample_rate),
                            cancel_on_idle_timeout=False)  # fmt: skip
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(started.wait(), 30)
        await script(worker, up, down)
    except BaseException:
        await worker.cancel(reason="the test failed")  # the failure shows, not a hung pipeline
        raise
    finally:
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 60)
    return up, down
