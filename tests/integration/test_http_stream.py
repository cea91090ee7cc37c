"""/tts/stream against a real server: exact audio, formats, headers, starter cache, concurrency."""

from __future__ import annotations

import io
import wave
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.conftest import metric, timing_row, tone_pcm, wait_for
from voxgate.audio import mulaw_decode, pcm16_bytes, resample, to_pcm16
from voxgate.engines.base import collect
from voxgate.engines.tone import ToneEngine
from voxgate.types import SynthesisRequest


def post(server, body, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/tts/stream", json=body, timeout=30, **kw)


def test_pcm_stream_is_exactly_the_engine_audio(tone_server):
    r = post(tone_server, {"text": "exact audio please"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/pcm"
    assert r.headers["x-sample-rate"] == "24000" and r.headers["x-chunk-ms"] == "40"
    assert r.headers["x-cache-starter"] == "false" and len(r.headers["x-request-id"]) >= 16
    assert r.content == tone_pcm("exact audio please")


def test_priority_is_accepted_and_does_not_change_the_audio(tone_server):
    r = post(tone_server, {"text": "urgent words", "priority": 10})
    assert r.status_code == 200 and r.content == tone_pcm("urgent words")


def test_body_arrives_in_chunk_ms_pieces(tone_server):
    with httpx.stream("POST", f"{tone_server.url}/tts/stream", json={"text": "one two three"}) as r:
        sizes = [len(part) for part in r.iter_raw()]
    assert max(sizes) <= 24000 * 2 * 40 // 1000
    assert sum(sizes) == 3 * 2880 * 2


def test_request_id_from_client_is_echoed(tone_server):
    r = post(tone_server, {"text": "hi"}, headers={"x-request-id": "trace-123"})
    assert r.headers["x-request-id"] == "trace-123"


def test_wav_stream_parses_as_wav(tone_server):
    r = post(tone_server, {"text": "wave file", "format": "wav", "sample_rate": 16000})
    with wave.open(io.BytesIO(r.content)) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2
        frames = w.readframes(10**6)
    expected = resample(collect(ToneEngine(), SynthesisRequest(text="wave file", voice="tone")).samples, 24000, 16000)
    assert frames == pcm16_bytes(expected)


def test_mulaw_is_8khz_and_decodes_to_the_audio(tone_server):
    r = post(tone_server, {"text": "telephone call", "format": "mulaw"})
    assert r.headers["x-sample-rate"] == "8000" and r.headers["content-type"] == "audio/basic"
    expected = to_pcm16(
        resample(collect(ToneEngine(), SynthesisRequest(text="telephone call", voice="tone")).samples, 24000, 8000)
    )
    decoded = mulaw_decode(r.content)
    assert len(decoded) == len(expected)
    assert np.max(np.abs(decoded.astype(int) - expected.astype(int))) < 1100  # mu-law step at 0.3 full scale


def test_voice_and_speed_change_the_audio(tone_server):
    low = post(tone_server, {"text": "pitch", "voice": "tone"}).content
    high = post(tone_server, {"text": "pitch", "voice": "tone-high"}).content
    fast = post(tone_server, {"text": "pitch", "speed": 2.0}).content
    assert low != high and len(low) == len(high)
    assert len(fast) == len(low) // 2


def test_openai_voice_names_map_to_the_default_voice(tone_server):
    assert post(tone_server, {"text": "alias", "voice": "alloy"}).content == tone_pcm("alias")


def test_starter_cache_hit_streams_the_cached_opener_then_the_rest(tone_server):
    hits = metric(tone_server, "voxgate_starter_cache_hits_total")
    r = post(tone_server, {"text": "Sure. Let us begin"})
    assert r.headers["x-cache-starter"] == "true"
    assert r.content == tone_pcm("Sure.") + tone_pcm("Let us begin")
    miss = post(tone_server, {"text": "Surely not"})
    assert miss.headers["x-cache-starter"] == "false"
    assert wait_for(lambda: metric(tone_server, "voxgate_starter_cache_hits_total") == hits + 1)


def test_starter_only_text_needs_no_engine_call(tone_server):
    r = post(tone_server, {"text": "好的"})
    assert r.headers["x-cache-starter"] == "true" and r.content == tone_pcm("好的")


def test_twenty_concurrent_streams_all_complete_correctly(tone_server):
    texts = [f"stream number {i} says {'word ' * (i % 5)}".strip() for i in range(20)]
    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=25)) as client:
        with ThreadPoolExecutor(20) as pool:
            bodies = list(pool.map(lambda t: client.post(f"{tone_server.url}/tts/stream", json={"text": t}), texts))
    assert [b.status_code for b in bodies] == [200] * 20
    assert [b.content for b in bodies] == [tone_pcm(t) for t in texts]


def test_voices_health_and_metrics(tone_server):
    voices = httpx.get(f"{tone_server.url}/v1/voices").json()
    assert voices["default"] == "tone" and {v["id"] for v in voices["voices"]} == {"tone", "tone-high"}
    health = httpx.get(f"{tone_server.url}/healthz").json()
    assert health["status"] == "ok" and health["engine"] == "tone"
    ttfa = 'voxgate_ttfa_seconds_count{endpoint="/tts/stream",starter="false"}'
    rtf = 'voxgate_rtf_count{endpoint="/tts/stream"}'
    audio = "voxgate_audio_seconds_total"
    before = [metric(tone_server, name) for name in (ttfa, rtf, audio)]
    post(tone_server, {"text": "count me"})
    assert wait_for(
        lambda: (
            [metric(tone_server, n) for n in (ttfa, rtf, audio)]
            == [before[0] + 1, before[1] + 1, pytest.approx(before[2] + 0.24)]
        )
    )
    assert metric(tone_server, "voxgate_ready") == 1 and metric(tone_server, "voxgate_active_streams") == 0


def test_server_side_timings_are_recorded(tone_server):
    post(tone_server, {"text": "timed request"}, headers={"x-request-id": "timed-1"})
    row = timing_row(tone_server, "timed-1")
    assert row["status"] == "completed" and row["audio_s"] == pytest.approx(0.24)
    assert 0 < row["ttfa_ms"] <= row["total_ms"]
