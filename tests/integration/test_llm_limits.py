"""The LLM limiter from the clients' side: real `voxgate serve` processes, real HTTP.

Most servers here talk to `SlowLLM`, a real OpenAI-compatible streaming server on loopback
standing in for a busy LLM: each answer waits at its gate until the test opens it, so the
order in which requests reach the LLM is decided by voxgate's limiter alone (asserted as an
order, never as a latency). The last tests use the real embedded LLM (llama.cpp)."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from websockets.sync.client import connect

from tests.conftest import wait_for
from tests.integration.fake_llm import SlowLLM, serve_llm
from voxgate.bench.server import ServerProcess

KEYS = {"A": "key-a", "B": "key-b"}
ADMIN = "admin-key"
INTERNAL = ("127.0.0.1:", "http://")  # nothing of the LLM's address may reach a client


@pytest.fixture(scope="module")
def slow_llm() -> Iterator[tuple[SlowLLM, str]]:
    with serve_llm(SlowLLM()) as (llm, url):
        yield llm, url


@pytest.fixture(scope="module")
def gated(slow_llm) -> Iterator[ServerProcess]:
    """One LLM request at a time, one per client, five may wait (a long queue timeout)."""
    env = {"LLM_URL": slow_llm[1], "LLM_MAX_CONCURRENT": "1", "LLM_MAX_PER_CLIENT": "1", "LLM_MAX_WAITING": "5",
           "LLM_QUEUE_TIMEOUT_S": "120", "API_KEYS": ",".join(KEYS.values()), "ADMIN_KEYS": ADMIN}  # fmt: skip
    with ServerProcess("tone", env=env) as server:
        yield server


@pytest.fixture
def llm(slow_llm, gated) -> Iterator[SlowLLM]:
    fake = slow_llm[0]
    fake.release()
    fake.arrived.clear()
    fake.hung_up.clear()
    yield fake
    fake.release()
    assert wait_for(lambda: _limiter(gated)["active"] == 0, timeout=60)  # every slot came back


def _limiter(server: ServerProcess) -> dict:
    return httpx.get(server.url + "/debug/llm", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).json()


def _chat(server: ServerProcess, client: str, content: str) -> httpx.Response:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": content}]}
    headers = {"authorization": f"Bearer {KEYS[client]}"}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def _words(response: httpx.Response) -> str:
    events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in events if e != "[DONE]")


def test_a_flooding_key_cannot_push_another_keys_request_back(gated, llm):
    llm.hold()
    with ThreadPoolExecutor(8) as pool:
        calls: dict[str, Future[httpx.Response]] = {"a1": pool.submit(_chat, gated, "A", "a1")}
        assert wait_for(lambda: llm.arrived == ["a1"], timeout=60)  # a1 holds the only slot
        calls.update({name: pool.submit(_chat, gated, "A", name) for name in ("a2", "a3", "a4", "a5")})
        assert wait_for(lambda: _limiter(gated)["waiting"] == 4, timeout=60)
        calls["b1"] = pool.submit(_chat, gated, "B", "b1")
        assert wait_for(lambda: _limiter(gated)["waiting"] == 5, timeout=60)
        overflow = _chat(gated, "A", "a6")  # the queue is full and A holds most of it
        assert overflow.status_code == 503 and overflow.json()["error"]["code"] == "busy"
        assert llm.arrived == ["a1"]  # nothing passed the limiter meanwhile
        llm.release()
        responses = {name: call.result(120) for name, call in calls.items()}
    assert all(r.status_code == 200 and _words(r).startswith("word0.") for r in responses.values())
    assert llm.arrived[:2] == ["a1", "b1"]  # B was served second, not sixth
    assert sorted(llm.arrived[2:]) == ["a2", "a3", "a4", "a5"]


def test_a_client_that_leaves_while_waiting_leaves_the_queue(gated, llm):
    llm.hold()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_chat, gated, "A", "first")
        assert wait_for(lambda: llm.arrived == ["first"], timeout=60)
        host = gated.url.removeprefix("http://")
        with socket.create_connection(("127.0.0.1", int(host.rsplit(":", 1)[1]))) as sock:
            body = json.dumps({"messages": [{"role": "user", "content": "impatient"}], "stream": True}).encode()
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEYS['B']}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
            sock.sendall(head.encode() + body)
            assert wait_for(lambda: _limiter(gated)["waiting"] == 1, timeout=60)
        assert wait_for(lambda: _limiter(gated)["waiting"] == 0, timeout=60)  # gone with its client
        assert _limiter(gated)["active"] == 1
        llm.release()
        assert first.result(120).status_code == 200
    assert llm.arrived == ["first"]  # the impatient request never reached the LLM


def test_a_client_that_leaves_mid_answer_frees_its_slot_and_the_llms(gated, llm):
    llm.hold()
    headers = {"authorization": f"Bearer {KEYS['A']}"}
    body = {"stream": True, "messages": [{"role": "user", "content": "cut short"}]}
    with httpx.stream("POST", gated.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()  # kept: a dropped iterator closes the connection
        assert next(chunks).startswith(b": opening")  # the answer has started
        assert _limiter(gated)["active"] == 1
    assert wait_for(lambda: _limiter(gated)["active"] == 0, timeout=60)
    assert wait_for(lambda: llm.hung_up == ["cut short"], timeout=60)  # voxgate hung up on the LLM too


def test_bridge_replies_queue_for_the_same_slots_as_chat(gated, llm):
    llm.hold()
    headers = {"authorization": f"Bearer {KEYS['B']}"}
    ask = {"messages": [{"role": "user", "content": "spoken"}], "max_tokens": 20}
    with ThreadPoolExecutor(2) as pool:
        chat = pool.submit(_chat, gated, "A", "written")
        assert wait_for(lambda: llm.arrived == ["written"], timeout=60)
        spoken = pool.submit(httpx.post, gated.url + "/v1/bridge/stream", json=ask, headers=headers, timeout=120)
        assert wait_for(lambda: _limiter(gated)["waiting"] == 1, timeout=60)  # waits behind the chat
        assert llm.arrived == ["written"]
        llm.release()
        assert chat.result(120).status_code == 200
        reply = spoken.result(120)
    done = json.loads(reply.text.strip().splitlines()[-1][5:])
    assert reply.status_code == 200 and done["status"] == "completed" and done["spoken"].startswith("word0.")
    assert llm.arrived == ["written", "spoken"]


def test_llm_failures_reach_clients_without_the_llms_address(gated, llm):
    headers = {"authorization": f"Bearer {KEYS['A']}"}
    chat = _chat(gated, "A", "fail now")
    assert chat.status_code == 502 and chat.json()["error"]["code"] == "llm_unavailable"
    bridge = httpx.post(gated.url + "/v1/bridge/stream", json={"messages": [{"role": "user", "content": "fail"}]},
                        headers=headers, timeout=120)  # fmt: skip
    done = json.loads(bridge.text.strip().splitlines()[-1][5:])
    assert done["status"] == "failed" and done["code"] == "llm_unavailable"
    ws_url = gated.url.replace("http://", "ws://") + "/v1/bridge/ws"
    with connect(ws_url, additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "user", "content": "fail over the socket"}))
        messages = [json.loads(m) for m in _text_frames(ws, until="done")]
    assert messages[-1]["status"] == "failed" and messages[-1]["code"] == "llm_unavailable"
    for text in (chat.text, bridge.text, json.dumps(messages)):
        assert not any(mark in text for mark in INTERNAL), text


def _text_frames(ws, until: str) -> Iterator[str]:
    while True:
        frame = ws.recv(timeout=120)
        if isinstance(frame, str):
            yield frame
            if json.loads(frame).get("type") == until:
                return


def test_the_llms_refusal_reaches_the_client_in_voxgates_error_shape(gated, llm):
    headers = {"authorization": f"Bearer {KEYS['A']}"}
    refused = httpx.post(gated.url + "/v1/chat/completions", json={"messages": "oops"}, headers=headers, timeout=60)
    assert refused.status_code == 400  # the LLM's status and message, voxgate's stable code
    expected = {"message": "Expected 'messages' to be an array", "type": "invalid_request_error", "param": None,
                "code": "invalid_request"}  # fmt: skip
    assert refused.json() == {"error": expected}


def test_a_wait_past_the_queue_timeout_is_busy(slow_llm):
    llm, url = slow_llm
    env = {"LLM_URL": url, "LLM_MAX_CONCURRENT": "1", "LLM_QUEUE_TIMEOUT_S": "1"}
    with ServerProcess("tone", env=env) as server:
        llm.release()
        llm.arrived.clear()
        llm.hold()
        try:
            with ThreadPoolExecutor(1) as pool:
                body = {"stream": True, "messages": [{"role": "user", "content": "slow"}]}
                first = pool.submit(httpx.post, server.url + "/v1/chat/completions", json=body, timeout=120)
                assert wait_for(lambda: llm.arrived == ["slow"], timeout=60)
                ask = {"messages": [{"role": "user", "content": "never heard"}]}
                refused = httpx.post(server.url + "/v1/bridge/stream", json=ask, timeout=120)
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "busy"
                llm.release()
                assert first.result(120).status_code == 200
        finally:
            llm.release()
    assert llm.arrived == ["slow"]


def test_without_an_llm_the_errors_name_no_address():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ServerProcess("tone", env={"LLM_URL": f"http://127.0.0.1:{port}/v1"}) as server:
        chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": []}, timeout=60)
        ask = {"messages": [{"role": "user", "content": "hello"}]}
        bridge = httpx.post(server.url + "/v1/bridge/stream", json=ask, timeout=120)
    assert chat.status_code == 502 and chat.json()["error"]["code"] == "llm_unavailable"
    assert json.loads(bridge.text.strip().splitlines()[-1][5:])["code"] == "llm_unavailable"
    for text in (chat.text, bridge.text):
        assert not any(mark in text for mark in INTERNAL), text


# ---------------------------------------------------------------- the real embedded LLM


def _embedded_port(server: ServerProcess) -> int:
    """The embedded LLM's port, from the server's own log (where an operator finds it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in list(server.log):
            found = re.search(r"embedded LLM \S+ at http://127\.0\.0\.1:(\d+)/v1", line)
            if found:
                return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError("no embedded LLM in the log:\n" + "\n".join(server.log))


def test_the_embedded_llms_port_refuses_requests_without_its_key(bridge):
    llm = f"http://127.0.0.1:{_embedded_port(bridge)}"
    ask = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    for headers in ({}, {"authorization": "Bearer guess"}):
        direct = httpx.post(llm + "/v1/chat/completions", json=ask, headers=headers, timeout=120)
        assert direct.status_code == 401, direct.text
    through = httpx.post(bridge.url + "/v1/chat/completions", json=ask, timeout=300)  # voxgate knows the key
    assert through.status_code == 200 and through.json()["choices"][0]["message"]["content"]
    assert "/" not in through.json()["model"]  # the model's name, not its path on the server
