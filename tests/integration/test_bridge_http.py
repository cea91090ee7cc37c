"""`POST /v1/bridge/stream` and `/v1/bridge/{id}/stop` on a real server: the embedded LLM
(llama.cpp + SmolLM2) writes, the tone engine speaks."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from voxgate.bench.server import ServerProcess

ASK = {"messages": [{"role": "user", "content": "Tell me a short story about a cat and a boat."}], "max_tokens": 80,
       "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def bridge() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env={"LLM_EMBEDDED": "true", "TONE_DELAY_MS": "20"}) as server:
        yield server


def _events(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def test_a_reply_is_spoken_segment_by_segment_while_the_llm_writes(bridge):
    with httpx.stream("POST", bridge.url + "/v1/bridge/stream", json=ASK, timeout=60) as response:
        assert response.status_code == 200 and response.headers["x-bridge-id"]
        events = list(_events(response))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "segment" and kinds[-1] == "done" and "audio" in kinds
    segments = [e for e in events if e["type"] == "segment"]
    assert segments[0]["kind"] == "starter" and [s["index"] for s in segments] == list(range(len(segments)))
    done = events[-1]
    assert done["status"] == "completed" and done["segments"] == len(segments)
    assert done["spoken"].split() == " ".join(s["text"] for s in segments).split()
    audio = b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == "audio")
    assert len(audio) > 0 and len(audio) % 2 == 0
    t = done["timings_ms"]
    assert 0 < t["llm_first_token"] <= t["first_segment"] <= t["first_audio"] and "cancel_to_silence" not in t
    assert 'voxgate_bridge_seconds_count{stage="first_audio"}' in httpx.get(bridge.url + "/metrics").text


def test_stop_ends_the_reply_at_once_and_says_what_was_spoken(bridge):
    with httpx.stream("POST", bridge.url + "/v1/bridge/stream", json=ASK, timeout=60) as response:
        reply_id = response.headers["x-bridge-id"]
        events, stopped_at = [], None
        for event in _events(response):
            events.append(event)
            if event["type"] == "audio" and stopped_at is None:
                stopped_at = time.perf_counter()
                threading.Thread(target=httpx.post, args=(f"{bridge.url}/v1/bridge/{reply_id}/stop",)).start()
        ended = time.perf_counter()
    done = events[-1]
    assert done["type"] == "done" and done["status"] == "cancelled" and done["spoken"]
    assert ended - stopped_at < 1.0 and 0 <= done["timings_ms"]["cancel_to_silence"] < 1000
    assert httpx.post(f"{bridge.url}/v1/bridge/{reply_id}/stop").status_code == 404  # it is over


def test_bad_requests_are_refused_with_typed_errors(bridge):
    url = bridge.url + "/v1/bridge/stream"
    assert httpx.post(url, content=b"{nope").json()["error"]["code"] == "invalid_request"
    assert httpx.post(url, json={"messages": []}).json()["error"]["code"] == "invalid_request"
    wrong_voice = httpx.post(url, json={**ASK, "voice": "nobody"})
    assert wrong_voice.status_code == 400 and wrong_voice.json()["error"]["code"] == "unknown_voice"
    assert httpx.get(bridge.url + "/healthz").status_code == 200
