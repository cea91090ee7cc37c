"""What the pipecat integration adds to first audio, against a real `voxgate serve` (tone).

Per trial, the same 12-word turn, token by token, two ways on one server:
  raw      a bare WebSocket client: deltas sent -> the first audio bytes on its socket;
  pipecat  `VoxgateTTSService` in a pipeline: LLM frames queued -> the first TTSAudioRawFrame at
           the pipeline's end; and, inside it, the first audio bytes on the service's socket ->
           that frame (the receive path alone).
Prints JSON (ms): medians, p95 and max of each, and the added latency (pipecat - raw, per trial).

    .venv/bin/python bench/pipecat_first_audio.py [--trials 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import websockets
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from voxgate.bench.server import ServerProcess
from voxgate.bench.stats import machine
from voxgate.integrations.pipecat import VoxgateTTSService
from voxgate.integrations.wire import socket_url

WORDS = [
    "Sure",
    "thing,",
    "here",
    "is",
    "the",
    "first",
    "part",
    "of",
    "a",
    "reply",
    "that",
    "an",
    "agent",
    "would",
    "speak",
]


class StampedService(VoxgateTTSService):
    """Notes when each turn's first audio bytes reach the service's socket."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.socket_audio_at: dict[str, float] = {}

    async def _on_message(self, message: str | bytes, header: dict[str, Any] | None) -> dict[str, Any] | None:
        if isinstance(message, bytes) and header is not None:
            context_id = self._utterances.context_of(header["utterance"])
            if context_id is not None:
                self.socket_audio_at.setdefault(context_id, time.perf_counter())
        return await super()._on_message(message, header)


class Sink(FrameProcessor):
    """Notes each context's first audio frame and counts finished turns."""

    def __init__(self) -> None:
        super().__init__()
        self.first_frame_at: dict[str, float] = {}
        self.stopped = 0
        self.changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and frame.context_id:
            self.first_frame_at.setdefault(frame.context_id, time.perf_counter())
        elif isinstance(frame, TTSStoppedFrame):
            self.stopped += 1
            self.changed.set()
        await self.push_frame(frame, direction)


async def raw_trial(ws: Any) -> float:
    """Seconds from the first delta sent to the first audio bytes received."""
    t0 = time.perf_counter()
    for word in WORDS:
        await ws.send(json.dumps({"type": "text.delta", "text": word + " "}))
    await ws.send(json.dumps({"type": "text.end"}))
    first = None
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            first = first or time.perf_counter()
        elif json.loads(message)["type"] == "utterance.done":
            return first - t0


async def pipecat_trial(worker: PipelineWorker, sink: Sink) -> float:
    """Seconds from the turn's first frame queued to its first audio frame at the sink."""
    stopped = sink.stopped
    t0 = time.perf_counter()
    await worker.queue_frame(LLMFullResponseStartFrame())
    for word in WORDS:
        await worker.queue_frame(LLMTextFrame(f" {word}"))
    await worker.queue_frame(LLMFullResponseEndFrame())
    while sink.stopped == stopped:
        sink.changed.clear()
        await asyncio.wait_for(sink.changed.wait(), 30)
    return max(sink.first_frame_at.values()) - t0


def summary(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {"p50": round(statistics.median(ms), 2), "p95": round(ms[int(0.95 * (len(ms) - 1))], 2),
            "max": round(ms[-1], 2)}  # fmt: skip


async def run(url: str, trials: int) -> dict[str, Any]:
    tts = StampedService(base_url=url)
    sink = Sink()
    worker = PipelineWorker(Pipeline([tts, sink]), params=PipelineParams(audio_out_sample_rate=24000),
                            cancel_on_idle_timeout=False)  # fmt: skip
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    raw, piped = [], []
    async with websockets.connect(socket_url(url)) as ws:
        await ws.send(json.dumps({"type": "session.start", "sample_rate": 24000}))
        await ws.recv()
        for i in range(trials + 1):  # the first of each is an untimed warm-up
            r, p = await raw_trial(ws), await pipecat_trial(worker, sink)
            if i:
                raw.append(r)
                piped.append(p)
    receive = [sink.first_frame_at[c] - at for c, at in tts.socket_audio_at.items() if c in sink.first_frame_at][1:]
    await worker.queue_frame(EndFrame())
    await running
    added = [p - r for p, r in zip(piped, raw, strict=True)]
    return {"engine": "tone", "trials": trials, "words": len(WORDS), "raw_first_audio_ms": summary(raw),
            "pipecat_first_audio_ms": summary(piped), "added_ms": summary(added),
            "socket_to_frame_ms": summary(receive), "target_ms": 30}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    header = {"bench": "pipecat_first_audio", "command": " ".join(["python", *sys.argv]),
              "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine()}  # fmt: skip
    with ServerProcess("tone") as server:
        print(json.dumps({**header, **asyncio.run(run(server.url, args.trials))}, indent=2))


if __name__ == "__main__":
    main()
