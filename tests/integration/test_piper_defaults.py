"""What the README advertises works on the CPU defaults (`make serve`: piper, 22050 Hz), with
nothing but the text and the format in the request."""

from __future__ import annotations

import asyncio
import io

import av
import httpx
import pytest
import websockets

from tests.integration.wsclient import Client

SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hello."}


def _decoded_samples(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


OPUS_REQUESTS = [
    ("/tts/stream", {"text": "Hello.", "format": "opus"}),
    ("/v1/audio/speech", {**SPEECH, "response_format": "opus"}),
]


@pytest.mark.parametrize(("path", "body"), OPUS_REQUESTS)
def test_opus_with_no_rate_asked_is_resampled_to_an_opus_rate(piper_server, path, body):
    r = httpx.post(f"{piper_server.url}{path}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-sample-rate"] == "24000"  # piper's 22050 raised to the next rate libopus takes
    assert r.content.startswith(b"OggS") and _decoded_samples(r.content) > 0


def test_opus_session_with_no_rate_asked_speaks_at_an_opus_rate(piper_server):
    async def run() -> Client:
        async with websockets.connect(piper_server.url.replace("http://", "ws://") + "/v1/tts/ws") as ws:
            c = Client(ws)
            started = await c.start(format="opus")
            assert started["type"] == "session.started", started
            assert started["sample_rate"] == 24000
            await c.words("Hello there.")
            await c.send(type="session.end")
            await c.until("session.done", timeout=60)
            return c

    client = asyncio.run(run())
    assert _decoded_samples(b"".join(m["payload"] for m in client.of("audio"))) > 0


def test_opus_at_a_rate_libopus_does_not_take_is_still_refused(piper_server):
    r = httpx.post(f"{piper_server.url}/tts/stream", json={"text": "Hello.", "format": "opus", "sample_rate": 22050})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_sample_rate"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/tts/stream", {"text": "."}), ("/v1/audio/speech", {**SPEECH, "input": "?", "response_format": "wav"})],
)
def test_text_with_nothing_to_speak_is_refused_as_blank_text_is(piper_server, path, body):
    r = httpx.post(f"{piper_server.url}{path}", json=body, timeout=60)  # was 200 with no audio (or a bare WAV header)
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["code"] == "empty_text" and "nothing to speak" in error["message"]
