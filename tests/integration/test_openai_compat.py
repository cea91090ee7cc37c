"""/v1/audio/speech through the official `openai` client, unchanged."""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import openai
import pytest

from tests.conftest import tone_pcm
from voxgate.bench.server import ServerProcess


@pytest.fixture
def client(tone_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tone_server.url}/v1", api_key="unused", max_retries=0)


def test_pcm_via_openai_client(client):
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input="hello from openai", response_format="pcm")
    assert audio.content == tone_pcm("hello from openai")  # 24 kHz, as OpenAI's pcm


def test_streaming_wav_via_openai_client(client):
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="nova", input="streamed wav", response_format="wav"
    ) as response:
        data = b"".join(response.iter_bytes())
    with wave.open(io.BytesIO(data)) as w:
        assert w.getframerate() == 24000
        assert w.readframes(10**6) == tone_pcm("streamed wav")


def test_sse_stream_format(tone_server):
    body = {"model": "tts-1", "voice": "alloy", "input": "server sent events", "response_format": "pcm",
            "stream_format": "sse"}  # fmt: skip
    r = httpx.post(f"{tone_server.url}/v1/audio/speech", json=body, timeout=30)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] == 3
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == tone_pcm("server sent events")


def test_sse_through_the_openai_client(client):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="sse via sdk", response_format="pcm", stream_format="sse"
    ) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert audio == tone_pcm("sse via sdk") and events[-1]["type"] == "speech.audio.done"


def _decoded(data: bytes) -> tuple[float, int]:
    """Seconds and rate of an encoded stream, decoded with PyAV."""
    import av

    with av.open(io.BytesIO(data)) as media:
        samples = sum(frame.samples for frame in media.decode(audio=0))
        rate = media.streams.audio[0].rate
    return samples / rate, rate


def test_the_default_format_is_mp3_as_openai_s(client):
    """An SDK call with no response_format (LiveKit's and pipecat's defaults) gets mp3."""
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts-2025-12-15", voice="alloy", input="mp3 by default"
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        data = b"".join(response.iter_bytes())
    seconds, rate = _decoded(data)
    expected = len(tone_pcm("mp3 by default")) / 2 / 24000
    assert rate == 24000 and expected <= seconds <= expected + 0.2


@pytest.mark.parametrize(("fmt", "media"), [("opus", "audio/ogg"), ("aac", "audio/aac"), ("flac", "audio/flac")])
def test_each_compressed_format_streams_and_decodes(tone_server, fmt, media):
    body = {"model": "tts-1-hd", "voice": "alloy", "input": f"streamed {fmt}", "response_format": fmt}
    with httpx.stream("POST", f"{tone_server.url}/v1/audio/speech", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"] == media
        data = b"".join(r.iter_bytes())
    seconds, _ = _decoded(data)
    expected = len(tone_pcm(f"streamed {fmt}")) / 2 / 24000
    assert expected <= seconds <= expected + 0.2


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"model": "no-such-model"}, "unknown_model"),
        ({"response_format": "webm"}, "unsupported_format"),
        ({"model": "gpt-4o-mini-tts-latest"}, "unknown_model"),
        ({"voice": "nobody"}, "unknown_voice"),
        ({"input": "   "}, "empty_text"),
    ],
)
def test_bad_requests_raise_typed_openai_errors(client, kwargs, code):
    args = {"model": "tts-1", "voice": "alloy", "input": "x", "response_format": "pcm", **kwargs}
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.speech.create(**args)
    assert info.value.status_code == 400
    assert info.value.body["code"] == code and info.value.body["type"] == "invalid_request_error"


def test_errors_have_openai_s_shape_with_the_field_at_fault(tone_server):
    r = httpx.post(f"{tone_server.url}/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": 42})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                  "param": "input", "code": "invalid_request"}}  # fmt: skip
    long = httpx.post(
        f"{tone_server.url}/v1/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "y" * 501}
    )
    assert long.status_code == 400 and long.json()["error"]["param"] == "input"  # OpenAI's 400, not 413
    for field, value, param in (("voice", "nobody", "voice"), ("input", " ", "input"), ("model", "x", "model"),
                                ("response_format", "webm", "response_format")):  # fmt: skip
        body = {"model": "tts-1", "voice": "alloy", "input": "hi", field: value}
        refused = httpx.post(f"{tone_server.url}/v1/audio/speech", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.json()
    missing = httpx.get(f"{tone_server.url}/v1/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_openai_voice_names_reach_every_server_voice_and_can_be_pinned(tone_server, client):
    """The tone engine has two voices: OpenAI's names take them in turn (the default first), so a
    client that only knows those names still reaches both; VOXGATE_VOICE_MAP pins a name."""
    listed = httpx.get(f"{tone_server.url}/v1/voices", timeout=30).json()["alias_voices"]
    assert listed["alloy"] == "tone" and listed["ash"] == "tone-high" and set(listed.values()) == {"tone", "tone-high"}
    audio = client.audio.speech.create(model="tts-1", voice="ash", input="a second voice", response_format="pcm")
    assert audio.content == tone_pcm("a second voice", "tone-high")
    with ServerProcess("tone", env={"VOICE_MAP": "alloy=tone-high,nova=tone"}) as pinned:
        pinned_client = openai.OpenAI(base_url=f"{pinned.url}/v1", api_key="unused", max_retries=0)
        audio = pinned_client.audio.speech.create(model="tts-1", voice="alloy", input="pinned", response_format="pcm")
        assert audio.content == tone_pcm("pinned", "tone-high")
        mapped = httpx.get(f"{pinned.url}/v1/voices", timeout=30).json()["alias_voices"]
        assert mapped["alloy"] == "tone-high" and mapped["nova"] == "tone" and mapped["ash"] == "tone"


def test_every_model_the_refusal_names_is_accepted_and_every_accepted_one_is_named(tone_server, client):
    """The unknown_model message lists exactly the names /v1/audio/speech takes (it once left
    out gpt-4o-tts, which it took)."""
    from voxgate.serving.protocol import OPENAI_MODELS

    r = httpx.post(f"{tone_server.url}/v1/audio/speech", json={"model": "nope", "input": "Hi.", "voice": "alloy"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_model"
    named = r.json()["error"]["message"].split("use one of ", 1)[1].split(" (")[0].split(", ")
    assert set(named) == {*OPENAI_MODELS, "voxgate", "tone"}
    for model in [*named, f"{OPENAI_MODELS[-1]}-2025-03-20"]:
        client.audio.speech.create(model=model, voice="alloy", input="Hi.", response_format="pcm")
