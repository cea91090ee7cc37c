"""pipecat's own `OpenAITTSService`, with its defaults (gpt-4o-mini-tts, voice "alloy", pcm at
24 kHz), against `voxgate serve`: what a pipecat user gets by pointing its base URL at voxgate."""

from __future__ import annotations

import asyncio

from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame
from pipecat.services.openai.tts import OpenAITTSService

from tests.conftest import tone_pcm
from tests.integration.pipecat_pipeline import Recorder, run_pipeline

TEXT = "Hello from pipecat's defaults."


def test_pipecat_openai_tts_with_its_defaults_speaks_through_voxgate(tone_server):
    tts = OpenAITTSService(api_key="unused", base_url=f"{tone_server.url}/v1")  # nothing else set

    async def script(worker, up: Recorder, down: Recorder) -> None:
        await worker.queue_frame(TTSSpeakFrame(TEXT))
        await down.until(lambda frames: any(isinstance(f, TTSStoppedFrame) for f in frames))

    up, down = asyncio.run(run_pipeline(tts, script))
    audio = [f for f in down.frames if isinstance(f, TTSAudioRawFrame)]
    assert audio and {(f.sample_rate, f.num_channels) for f in audio} == {(24000, 1)}
    assert b"".join(f.audio for f in audio) == tone_pcm(TEXT)  # "alloy" is the server's first voice
    assert not [f for f in up.frames if isinstance(f, ErrorFrame)]
