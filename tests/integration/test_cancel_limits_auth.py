"""Disconnect cancels the engine; per-client and global stream limits; bearer-token auth."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest

from tests.conftest import LIMITS_KEYS, metric, timing_row, wait_for

LONG_TEXT = " ".join(f"word{i}" for i in range(200))  # 200 chunks at 40 ms each: 8 s of generation


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_disconnect_mid_stream_cancels_the_engine_within_one_chunk(slow_server):
    headers = auth(LIMITS_KEYS[0])
    cancelled_before = metric(slow_server, 'voxgate_streams_cancelled_total{reason="client_disconnect"}')
    with httpx.stream("POST", f"{slow_server.url}/tts/stream", json={"text": LONG_TEXT},
                      headers={**headers, "x-request-id": "drop-me"}) as r:  # fmt: skip
        received = 0
        for part in r.iter_raw():
            received += len(part)
            if received >= 3 * 5760:  # three 120 ms units
                break
    assert wait_for(lambda: metric(slow_server, "voxgate_active_streams") == 0)
    assert metric(slow_server, 'voxgate_streams_cancelled_total{reason="client_disconnect"}') == cancelled_before + 1
    row = timing_row(slow_server, "drop-me")
    assert row["status"] == "client_disconnect"
    # the engine stopped: it made at most the chunks sent plus the one in flight plus one prefetched
    assert row["chunks_generated"] <= 3 + 3
    assert wait_for(lambda: metric(slow_server, "voxgate_engine_streams_open") == 0)  # engine iterator closed


def _open(stack: ExitStack, server, key: str) -> httpx.Response:
    r = stack.enter_context(
        httpx.stream("POST", f"{server.url}/tts/stream", json={"text": LONG_TEXT}, headers=auth(key), timeout=30)
    )
    return r


def test_per_client_and_global_stream_limits(slow_server):
    url = f"{slow_server.url}/tts/stream"
    with ExitStack() as stack:
        first = [_open(stack, slow_server, LIMITS_KEYS[0]) for _ in range(2)]
        assert [r.status_code for r in first] == [200, 200]
        third = httpx.post(url, json={"text": "one more"}, headers=auth(LIMITS_KEYS[0]))
        assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_streams"
        assert _open(stack, slow_server, LIMITS_KEYS[1]).status_code == 200
        busy = httpx.post(url, json={"text": "no room"}, headers=auth(LIMITS_KEYS[2]))
        assert busy.status_code == 503 and busy.json()["error"]["code"] == "busy"
    assert wait_for(lambda: metric(slow_server, "voxgate_active_streams") == 0)
    assert httpx.post(url, json={"text": "room again"}, headers=auth(LIMITS_KEYS[2])).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": "key-one"}, {"authorization": "Basic a2V5LW9uZQ=="}],
)
def test_missing_or_wrong_key_is_401(slow_server, headers):
    for method, path in (("POST", "/tts/stream"), ("GET", "/v1/voices"), ("GET", "/metrics"), ("GET", "/nope")):
        r = httpx.request(method, f"{slow_server.url}{path}", json={"text": "hi"}, headers=headers)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"


def test_health_is_open_and_keys_work(slow_server):
    assert httpx.get(f"{slow_server.url}/healthz").status_code == 200
    r = httpx.post(f"{slow_server.url}/tts/stream", json={"text": "let me in"}, headers=auth(LIMITS_KEYS[1]))
    assert r.status_code == 200 and len(r.content) == 3 * 5760
