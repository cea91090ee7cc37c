"""An engine that breaks: typed error before audio, an unmistakably truncated stream after."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import metric, wait_for


def test_failure_before_first_audio_is_a_json_error(tone_server):
    r = httpx.post(f"{tone_server.url}/tts/stream", json={"text": "[[fail]] never spoken"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"


def test_failure_mid_stream_drops_the_connection_without_a_clean_end(tone_server):
    before = metric(tone_server, 'voxgate_errors_total{code="engine_error"}')
    internal_before = metric(tone_server, 'voxgate_errors_total{code="internal_error"}')
    received = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", f"{tone_server.url}/tts/stream", json={"text": "one two [[fail]] four"}) as r:
            assert r.status_code == 200
            for part in r.iter_raw():
                received += part
    assert len(received) == 2 * 2880 * 2  # the two units before the fault, nothing after
    assert wait_for(lambda: metric(tone_server, 'voxgate_errors_total{code="engine_error"}') == before + 1)
    assert metric(tone_server, 'voxgate_errors_total{code="internal_error"}') == internal_before
    assert httpx.post(f"{tone_server.url}/tts/stream", json={"text": "server still fine"}).status_code == 200


def test_failure_mid_sse_stream_ends_with_an_error_event(tone_server):
    body = {
        "model": "tts-1",
        "voice": "alloy",
        "input": "one [[fail]]",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    r = httpx.post(f"{tone_server.url}/v1/audio/speech", json=body)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "engine_error"
    assert "speech.audio.done" not in {e["type"] for e in events}
