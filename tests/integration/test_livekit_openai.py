"""LiveKit Agents' own OpenAI TTS plugin, with its defaults (gpt-4o-mini-tts, voice "ash", mp3),
against `voxgate serve`: what a LiveKit user gets by pointing the plugin's client at voxgate."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
from livekit.agents import utils
from livekit.plugins import openai as livekit_openai

from tests.conftest import tone_pcm

TEXT = "Hello from LiveKit's defaults."


async def _synthesize(url: str) -> list:
    client = openai.AsyncClient(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    tts = livekit_openai.TTS(client=client)  # every other setting left as the plugin ships it
    async with utils.http_context.open():
        return [event.frame async for event in tts.synthesize(TEXT)]


def test_livekit_openai_plugin_with_its_defaults_speaks(tone_server):
    frames = asyncio.run(asyncio.wait_for(_synthesize(tone_server.url), 60))
    assert frames and {f.sample_rate for f in frames} == {24000} and {f.num_channels for f in frames} == {1}
    pcm = np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])
    expected = np.frombuffer(tone_pcm(TEXT, "tone-high"), dtype=np.int16)  # "ash" is the second voice
    # mp3 adds the encoder's priming and pads its last frame (no gapless header on a live stream):
    # at most three of its 576-sample frames at 24 kHz
    assert 0 <= len(pcm) - len(expected) <= 3 * 576
    level = np.sqrt(np.mean(pcm.astype(np.float64) ** 2))
    assert 0.5 * np.sqrt(np.mean(expected.astype(np.float64) ** 2)) < level  # speech, not silence
