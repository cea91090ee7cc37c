"""Pre-transport capture (VOXGATE_AGENT_CAPTURE_DIR): each reply's enqueued audio as a WAV
per trace id, kept when the reply is cancelled mid-stream."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from voxgate.agent.capture import ReplyCapture
from voxgate.agent.driver import AgentConfig, CallDriver
from voxgate.audio import decode_wav
from voxgate.speech.limits import StreamLimiter
from voxgate.types import AudioChunk


def _tone(seconds: float, rate: int) -> np.ndarray:
    return (0.3 * np.sin(2 * np.pi * 300 * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def test_capture_joins_pieces_at_the_first_rate_and_writes_nothing_without_audio(tmp_path: Path) -> None:
    capture = ReplyCapture(tmp_path / "pre", "call-1")
    assert capture.save() is None and not (tmp_path / "pre").exists()
    capture.add(_tone(0.5, 22050), 22050)
    capture.add((_tone(0.25, 44100) * 32767).astype(np.int16), 44100)  # int16 at another rate
    samples, rate = decode_wav(capture.save().read_bytes())  # type: ignore[union-attr]
    assert rate == 22050 and abs(len(samples) - round(0.75 * 22050)) <= 2
    assert 0.15 < float(np.sqrt(np.mean(samples[-5000:] ** 2))) < 0.25  # the resampled piece is the same tone


class _Outbound:
    on_published = on_drained = None

    def __init__(self) -> None:
        self.enqueued: list[np.ndarray] = []

    def enqueue(self, pcm: np.ndarray, sample_rate: int, tag: Any) -> None:
        self.enqueued.append(pcm)

    def end(self, tag: Any) -> None: ...

    def flush(self, tag: Any = None) -> int:
        return 0

    def hold(self, on: bool) -> None: ...


class _StallingPipeline:
    """Yields two chunks, then waits forever (a reply still speaking when it is cut)."""

    cancelled = False

    async def run(self, deltas: Any):
        segment = SimpleNamespace(index=0)
        for _ in range(2):
            yield segment, AudioChunk(_tone(0.2, 22050), 22050)
        await asyncio.Event().wait()


class _Llm:
    async def aclose(self) -> None: ...


def _cut_mid_reply(config: AgentConfig) -> None:
    """Run one reply through the driver and cancel it after two chunks were enqueued."""
    outbound = _Outbound()
    events = SimpleNamespace(send_event=lambda m: None)
    limiter = StreamLimiter(max_streams=1, max_per_client=1)
    state = SimpleNamespace(limiter=limiter)  # the reply holds a stream slot while it speaks
    driver = CallDriver(state, "call", outbound, events, None, None, config)  # type: ignore[arg-type]

    async def run() -> None:
        task = asyncio.ensure_future(driver._speak("call-1", _StallingPipeline(), _Llm(), []))  # type: ignore[arg-type]
        while len(outbound.enqueued) < 2:
            await asyncio.sleep(0.001)
        assert limiter.active == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert limiter.active == 0  # a cut reply gives its slot back

    asyncio.run(run())


def test_a_cancelled_reply_keeps_the_audio_it_had_enqueued(tmp_path: Path) -> None:
    _cut_mid_reply(AgentConfig(capture_dir=tmp_path))
    samples, rate = decode_wav((tmp_path / "call-1.wav").read_bytes())
    assert rate == 22050 and len(samples) == 2 * len(_tone(0.2, 22050))


def test_no_capture_dir_writes_no_file(tmp_path: Path) -> None:
    _cut_mid_reply(AgentConfig())
    assert list(tmp_path.iterdir()) == []
