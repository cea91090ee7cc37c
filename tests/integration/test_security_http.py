"""Hostile and careless HTTP clients (issue 16), from the client's side: half-sent requests,
admin endpoints, a refused bridge-socket config. Real servers on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import websockets

from tests.integration.fake_llm import SlowLLM, serve_llm
from voxgate.bench.server import ServerProcess


@pytest.fixture(scope="module")
def strict() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env={"HEADER_TIMEOUT_S": "1", "API_KEYS": "user-key"}) as server:
        yield server


def _connect(server: ServerProcess) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing, or None if it kept the connection open."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    return received


def test_a_request_head_that_never_finishes_is_dropped(strict):
    """Before: a half-sent head held its connection (and a server slot) forever."""
    sock = _connect(strict)
    sock.sendall(b"POST /tts/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthor")  # and nothing more
    assert _closed_within(sock, 30) == b""  # closed (HEADER_TIMEOUT_S=1), no answer owed
    sock.close()


def test_the_next_request_on_a_kept_alive_connection_has_the_same_deadline(strict):
    sock = _connect(strict)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # a second head, half-sent
    assert _closed_within(sock, 30) is not None
    sock.close()


def test_a_body_that_never_arrives_is_answered_408(strict):
    sock = _connect(strict)
    sock.sendall(b"POST /tts/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer user-key\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"text\": ")  # fmt: skip
    answer = _closed_within(sock, 30) or b""
    sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert b'"request_timeout"' in body


def test_a_slow_but_steady_client_is_not_cut_off(strict):
    """The deadline is for the whole head, generous for any real client: one that sends its
    request in pieces within it is served."""
    sock = _connect(strict)
    for part in (b"GET /heal", b"thz HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"\r\n"):
        sock.sendall(part)
        time.sleep(0.05)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()


def test_debug_endpoints_are_off_without_admin_keys_and_admin_only_with_them(strict):
    """Before: /debug/timings listed every WebSocket session id to any key."""
    assert httpx.get(strict.url + "/debug/timings", headers={"authorization": "Bearer user-key"}).status_code == 403
    assert httpx.get(strict.url + "/debug/timings", headers=strict.admin_headers()).status_code == 200
    with ServerProcess("tone", env={"ADMIN_KEYS": ""}) as bare:
        off = httpx.get(bare.url + "/debug/timings", headers={"authorization": "Bearer anything"})
        assert off.status_code == 404 and off.json()["error"]["code"] == "not_found"


def test_a_refused_bridge_config_changes_nothing():
    """Before: after an `unknown_voice` error the socket's next turns failed with unknown_voice."""
    with serve_llm(SlowLLM(tokens=3)) as (_, llm_url), ServerProcess("tone", env={"LLM_URL": llm_url}) as server:

        async def run() -> dict:
            url = server.url.replace("http://", "ws://") + "/v1/bridge/ws"
            async with websockets.connect(url) as ws:
                assert json.loads(await ws.recv())["type"] == "ready"
                await ws.send(json.dumps({"type": "config", "voice": "no-such-voice", "max_tokens": 9}))
                refused = json.loads(await ws.recv())
                assert refused["type"] == "error" and refused["code"] == "unknown_voice"
                await ws.send(json.dumps({"type": "user", "content": "hello"}))
                while True:
                    message = await asyncio.wait_for(ws.recv(), 60)
                    if isinstance(message, str) and (event := json.loads(message))["type"] in ("done", "error"):
                        return event

        done = asyncio.run(run())
        assert done["type"] == "done" and done["status"] == "completed", done
