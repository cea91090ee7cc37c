"""`VoxgateTTSService` in real pipecat pipelines against a real `voxgate serve` (tone engine,
behind an API key): streamed text, sample rate, voices, interruption, errors, no key in logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from loguru import logger as loguru_logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.worker import PipelineWorker

from tests.conftest import tone_pcm
from tests.integration.pipecat_pipeline import Recorder, run_pipeline
from voxgate.bench.server import ServerProcess
from voxgate.integrations.pipecat import VoxgateServiceError, VoxgateTTSService

KEY = "pipecat-secret-key-0123456789"
WORDS = [
    "Streaming",
    "words",
    "reach",
    "the",
    "gateway",
    "one",
    "token",
    "at",
    "a",
    "time",
    "and",
    "the",
    "audio",
    "flows",
    "back",
    "early",
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """Tone at 50 ms per unit (one unit a chunk), so a long utterance is still being made when
    it is interrupted; behind an API key."""
    with ServerProcess("tone", env={"API_KEYS": KEY, "TONE_DELAY_MS": "50"}) as server:
        yield server


def _service(server: ServerProcess, voice: str | None = "tone-high", key: str = KEY) -> VoxgateTTSService:
    return VoxgateTTSService(base_url=server.url, api_key=key, settings=VoxgateTTSService.Settings(voice=voice))


async def _say(worker: PipelineWorker, words: list[str]) -> None:
    for word in words:
        await worker.queue_frame(LLMTextFrame(f" {word}"))


def _pcm(frames: list[TTSAudioRawFrame]) -> bytes:
    return b"".join(f.audio for f in frames)


def _stopped(frames: list[Frame]) -> int:
    return sum(isinstance(f, TTSStoppedFrame) for f in frames)


def test_streamed_tokens_are_spoken_before_the_turn_ends_in_the_voice_asked_for(server):
    events: list[str] = []

    async def script(worker: PipelineWorker, up: Recorder, down: Recorder) -> None:
        await worker.queue_frame(LLMFullResponseStartFrame())
        await _say(worker, WORDS[:5])
        events.append("first words sent")
        await down.until(lambda frames: any(isinstance(f, TTSAudioRawFrame) for f in frames))
        events.append("audio out")  # with five of the turn's words: the rest is not sent yet
        await _say(worker, WORDS[5:])
        await worker.queue_frame(LLMFullResponseEndFrame())
        events.append("last words sent")
        await down.until(lambda frames: _stopped(frames) == 1)

    up, down = asyncio.run(run_pipeline(_service(server), script))
    assert events == ["first words sent", "audio out", "last words sent"]
    audio = down.audio()
    assert audio and {(f.sample_rate, f.num_channels) for f in audio} == {(24000, 1)}
    assert len({f.context_id for f in audio}) == 1  # one turn, one audio context
    text = " ".join(WORDS)
    assert tone_pcm(text, "tone-high") != tone_pcm(text, "tone")  # the voices differ
    assert _pcm(audio) == tone_pcm(text, "tone-high")  # every word, once, in order, in its voice
    assert not [f for f in up.frames if isinstance(f, ErrorFrame)]


def test_audio_comes_at_the_pipeline_s_sample_rate(server):
    async def script(worker: PipelineWorker, up: Recorder, down: Recorder) -> None:
        await worker.queue_frame(LLMFullResponseStartFrame())
        await _say(worker, WORDS)
        await worker.queue_frame(LLMFullResponseEndFrame())
        await down.until(lambda frames: _stopped(frames) == 1)

    _, down = asyncio.run(run_pipeline(_service(server), script, sample_rate=16000))
    audio = down.audio()
    assert {f.sample_rate for f in audio} == {16000}
    expected = len(tone_pcm(" ".join(WORDS), "tone-high")) // 2 * 16000 // 24000
    assert abs(len(_pcm(audio)) // 2 - expected) <= 0.01 * expected  # the server resampled it, whole


def test_an_interruption_cancels_the_utterance_and_none_of_its_audio_follows(server):
    long_turn = [f"word{i}" for i in range(80)]  # 9.6 s of audio, made at 50 ms a word: 4 s
    statuses: list[str] = []
    tts = _service(server)

    @tts.event_handler("on_utterance_done")
    async def _done(service, status: str) -> None:
        statuses.append(status)

    async def script(worker: PipelineWorker, up: Recorder, down: Recorder) -> None:
        await worker.queue_frame(LLMFullResponseStartFrame())
        await _say(worker, long_turn)
        await worker.queue_frame(LLMFullResponseEndFrame())
        await down.until(lambda frames: any(isinstance(f, TTSAudioRawFrame) for f in frames))
        await worker.queue_frame(InterruptionFrame())
        await down.until(lambda frames: any(isinstance(f, InterruptionFrame) for f in frames))
        await worker.queue_frame(LLMFullResponseStartFrame())  # the next turn speaks as usual
        await _say(worker, WORDS)
        await worker.queue_frame(LLMFullResponseEndFrame())
        await down.until(lambda frames: _stopped(frames) == 1)

    _, down = asyncio.run(run_pipeline(tts, script))
    cut = next(i for i, f in enumerate(down.frames) if isinstance(f, InterruptionFrame))
    interrupted = down.audio()[0].context_id
    first_turn = down.audio(interrupted)
    after = down.frames[cut:]
    assert not [f for f in after if isinstance(f, TTSAudioRawFrame) and f.context_id == interrupted]
    # The server got the cancel: the utterance ended "cancelled" (its 80 words take 4 s to make, and
    # the interruption follows their first audio: a stated, generous margin), then the next completed.
    assert statuses == ["cancelled", "completed"]
    assert len(_pcm(first_turn)) < len(tone_pcm(" ".join(long_turn)))
    second = [f for f in after if isinstance(f, TTSAudioRawFrame)]
    assert _pcm(second) == tone_pcm(" ".join(WORDS), "tone-high")


def test_the_voice_changes_at_runtime_between_turns(server):
    async def turn(worker: PipelineWorker, down: Recorder, n: int) -> None:
        await worker.queue_frame(LLMFullResponseStartFrame())
        await _say(worker, WORDS)
        await worker.queue_frame(LLMFullResponseEndFrame())
        await down.until(lambda frames: _stopped(frames) == n)

    async def script(worker: PipelineWorker, up: Recorder, down: Recorder) -> None:
        await turn(worker, down, 1)
        await worker.queue_frame(TTSUpdateSettingsFrame(delta=VoxgateTTSService.Settings(voice="tone")))
        await turn(worker, down, 2)

    _, down = asyncio.run(run_pipeline(_service(server), script))
    contexts = list(dict.fromkeys(f.context_id for f in down.audio()))
    assert len(contexts) == 2
    text = " ".join(WORDS)
    assert _pcm(down.audio(contexts[0])) == tone_pcm(text, "tone-high")
    assert _pcm(down.audio(contexts[1])) == tone_pcm(text, "tone")


@pytest.mark.parametrize(("voice", "key", "code"), [("no-such-voice", KEY, "unknown_voice"),
                                                    ("tone", "wrong-key", "unauthorized")])  # fmt: skip
def test_refusals_are_typed_error_frames_and_no_key_is_logged(server, caplog, voice, key, code):
    logged: list[str] = []
    sink = loguru_logger.add(lambda message: logged.append(str(message)), level="TRACE")
    caplog.set_level(logging.DEBUG)  # websockets logs the upgrade request's headers at DEBUG

    async def script(worker: PipelineWorker, up: Recorder, down: Recorder) -> None:
        await up.until(lambda frames: any(isinstance(f, ErrorFrame) for f in frames))

    try:
        up, _ = asyncio.run(run_pipeline(_service(server, voice=voice, key=key), script))
    finally:
        loguru_logger.remove(sink)
    errors = [f for f in up.frames if isinstance(f, ErrorFrame)]
    assert isinstance(errors[0].exception, VoxgateServiceError) and errors[0].exception.code == code
    everything = "\n".join(logged) + caplog.text + "\n".join(str(f.error) for f in errors)
    assert "Authorization" in caplog.text or "authorization" in caplog.text  # the headers were logged...
    assert key not in everything  # ...and the key was not
