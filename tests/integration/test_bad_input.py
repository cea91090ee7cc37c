"""Every kind of bad input gets a typed 4xx JSON error, never a 500, and hurts nobody."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import metric

SPEECH = {"model": "tts-1", "voice": "alloy", "input": "hello", "response_format": "pcm"}
CASES = [
    # (path, raw body or json, status, code)
    ("/tts/stream", b"{not json", 400, "invalid_request"),
    ("/tts/stream", b"", 400, "invalid_request"),
    ("/tts/stream", b"null", 400, "invalid_request"),
    ("/tts/stream", b"[1, 2]", 400, "invalid_request"),
    ("/tts/stream", b"\xff\xfe\x00garbage", 400, "invalid_request"),
    ("/tts/stream", {}, 400, "invalid_request"),
    ("/tts/stream", {"text": 5}, 400, "invalid_request"),
    ("/tts/stream", {"text": ["a"]}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "sample_rate": "16000"}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "speed": 0}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "speed": "fast"}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "txet": "typo"}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "priority": 101}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "priority": "high"}, 400, "invalid_request"),
    ("/tts/stream", {"text": ""}, 400, "empty_text"),
    ("/tts/stream", {"text": " \n\t "}, 400, "empty_text"),
    ("/tts/stream", {"text": "."}, 400, "empty_text"),  # nothing to speak: piper answered 200 with no audio
    ("/tts/stream", {"text": " ?! … "}, 400, "empty_text"),
    ("/tts/stream", {"text": "x" * 501}, 413, "text_too_long"),
    ("/tts/stream", {"text": "a\u0000b"}, 400, "invalid_request"),
    ("/tts/stream", {"text": "Okay, then\u0007"}, 400, "invalid_request"),
    ("/tts/stream", {"text": "hi", "voice": "nobody"}, 400, "unknown_voice"),
    ("/tts/stream", {"text": "hi", "format": "webm"}, 400, "unsupported_format"),
    ("/tts/stream", {"text": "hi", "format": "opus", "sample_rate": 22050}, 400, "unsupported_sample_rate"),
    ("/tts/stream", {"text": "hi", "sample_rate": 12345}, 400, "unsupported_sample_rate"),
    ("/tts/stream", {"text": "hi", "format": "mulaw", "sample_rate": 16000}, 400, "unsupported_sample_rate"),
    ("/v1/audio/speech", b"{", 400, "invalid_request"),
    ("/v1/audio/speech", {"model": "tts-1", "voice": "alloy"}, 400, "invalid_request"),
    ("/v1/audio/speech", {**SPEECH, "input": 42}, 400, "invalid_request"),
    ("/v1/audio/speech", {**SPEECH, "speed": 10}, 400, "invalid_request"),
    ("/v1/audio/speech", {**SPEECH, "voice": {"name": "x"}}, 400, "invalid_request"),
    ("/v1/audio/speech", {**SPEECH, "model": "whisper-1"}, 400, "unknown_model"),
    ("/v1/audio/speech", {**SPEECH, "response_format": "mulaw"}, 400, "unsupported_format"),
    ("/v1/audio/speech", {**SPEECH, "stream_format": "ws"}, 400, "invalid_request"),
    ("/v1/audio/speech", {**SPEECH, "input": ""}, 400, "empty_text"),
    ("/v1/audio/speech", {**SPEECH, "input": "?", "response_format": "wav"}, 400, "empty_text"),
    ("/v1/audio/speech", {**SPEECH, "input": "y" * 501}, 400, "text_too_long"),  # 400 as OpenAI, not 413
    ("/v1/audio/speech", {**SPEECH, "voice": "nobody"}, 400, "unknown_voice"),
]


@pytest.mark.parametrize(("path", "body", "status", "code"), CASES)
def test_bad_request_gets_typed_error(tone_server, path, body, status, code):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{tone_server.url}{path}", timeout=10, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["message"]


FIELD_AT_FAULT = [
    # (body of /tts/stream, the field its refusal names: the same as /v1/audio/speech does for its own)
    ({"text": "hi", "voice": "nobody"}, "voice"),
    ({"text": "hi", "format": "webm"}, "format"),
    ({"text": "hi", "format": "opus", "sample_rate": 22050}, "sample_rate"),
    ({"text": "hi", "sample_rate": 12345}, "sample_rate"),
    ({"text": "x" * 501}, "text"),
    ({"text": " "}, "text"),
    ({"text": "."}, "text"),
]


@pytest.mark.parametrize(("body", "param"), FIELD_AT_FAULT)
def test_tts_stream_refusal_names_the_field_at_fault(tone_server, body, param):
    r = httpx.post(f"{tone_server.url}/tts/stream", json=body, timeout=10)
    assert r.status_code in (400, 413) and r.json()["error"]["param"] == param, r.json()


def test_a_body_that_is_not_json_says_where_and_why(tone_server):
    """A lone surrogate escape is not JSON here (the WebSocket names it too): the refusal says
    so, not only that the body is invalid."""
    for raw in (b'{"text": "hi\\ud800"}', b'{"text": "hi'):
        r = httpx.post(f"{tone_server.url}/tts/stream", content=raw, timeout=10)
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and message.startswith("the body is not valid JSON: ") and "column" in message


def test_error_responses_carry_the_request_id(tone_server):
    r = httpx.post(f"{tone_server.url}/tts/stream", json={"text": ""}, headers={"x-request-id": "bad-1"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-1"
    r = httpx.get(f"{tone_server.url}/nope")
    assert len(r.headers["x-request-id"]) == 32


def test_debug_timings_rejects_a_negative_count(tone_server):
    r = httpx.get(f"{tone_server.url}/debug/timings", params={"last": -1}, headers=tone_server.admin_headers())
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


def test_oversized_body_is_refused_by_content_length(tone_server):
    r = httpx.post(f"{tone_server.url}/tts/stream", content=b'{"text": "' + b"a" * 5000 + b'"}')
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_oversized_chunked_upload_is_refused_while_reading(tone_server):
    def body():
        yield b'{"text": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    r = httpx.post(f"{tone_server.url}/tts/stream", content=body())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_path_and_wrong_method_are_json_errors(tone_server):
    r = httpx.get(f"{tone_server.url}/no/such/thing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(f"{tone_server.url}/tts/stream")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_language_the_voice_does_not_speak_is_refused(piper_server):
    r = httpx.post(f"{piper_server.url}/tts/stream", json={"text": "bonjour", "language": "fr"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_language"
    assert r.json()["error"]["param"] == "language"
    ok = httpx.post(f"{piper_server.url}/tts/stream", json={"text": "Hi.", "language": "English"})
    assert ok.status_code == 200


def test_bad_input_never_caused_an_internal_error(tone_server):
    for path, body, _, _ in CASES:
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        httpx.post(f"{tone_server.url}{path}", **kwargs)
    assert metric(tone_server, 'voxgate_errors_total{code="internal_error"}') == 0
    assert httpx.get(f"{tone_server.url}/healthz").status_code == 200
    assert httpx.post(f"{tone_server.url}/tts/stream", json={"text": "still fine"}).status_code == 200
