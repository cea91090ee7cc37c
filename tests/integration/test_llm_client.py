"""The OpenAI-compatible streaming client against real HTTP servers on loopback.

The misbehaving servers here are scripted stand-ins (named as such): a real LLM server does
not fail on demand. The embedded LLM's own tests use the real model."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from voxgate.bridge.llm import Conversation, LLMBadResponse, LLMClient, LLMConfig, LLMTimeout, LLMUnavailable
from voxgate.types import InvalidRequest


def _event(text: str) -> str:
    return "data: " + json.dumps({"choices": [{"delta": {"content": text}}]}) + "\n\n"


class ScriptedLLM:
    """A stand-in OpenAI-compatible server whose next replies are scripted per test."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.requests: list[dict] = []

    async def completions(self, request: Request):
        self.requests.append(await request.json())
        step = self.script.pop(0) if self.script else "ok"
        if step == "500":
            return JSONResponse({"error": "overloaded"}, status_code=500)
        if step == "400":
            return JSONResponse({"error": "bad model"}, status_code=400)

        async def body():
            if step == "stall":
                await asyncio.sleep(5)
            if step == "garbage":
                yield "data: {not json\n\n"
                return
            for word in ("Hello", " there", ", friend."):
                yield _event(word)
                await asyncio.sleep(0.01)
            if step == "cut":
                return  # the connection ends without [DONE]
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedLLM, str]]:
    llm = ScriptedLLM()
    app = Starlette(routes=[Route("/v1/chat/completions", llm.completions, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield llm, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server.should_exit = True
    thread.join(5)


async def _collect(client: LLMClient, messages: list[dict]) -> list[str]:
    try:
        return [d async for d in client.stream(messages)]
    finally:
        await client.aclose()


def _run(base: str, script: list[str], llm: ScriptedLLM, **config) -> list[str]:
    llm.script = list(script)
    client = LLMClient(LLMConfig(base, model="m", **config))
    return asyncio.run(_collect(client, [{"role": "user", "content": "hi"}]))


def test_deltas_stream_in_order_with_the_request_as_openai_sends_it(scripted):
    llm, base = scripted
    assert _run(base, ["ok"], llm, temperature=0.5, max_tokens=20) == ["Hello", " there", ", friend."]
    assert llm.requests[-1] == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                                "temperature": 0.5, "max_tokens": 20}  # fmt: skip


def test_errors_before_the_first_token_are_retried(scripted):
    llm, base = scripted
    # the stall (5 s) outlasts the timeout; the retried "ok" answers in milliseconds, and 1 s
    # leaves room for a busy machine to schedule the stand-in server's thread
    assert "".join(_run(base, ["500", "stall", "ok"], llm, first_token_timeout_s=1.0)) == "Hello there, friend."
    with pytest.raises(LLMUnavailable, match="answered 500"):
        _run(base, ["500", "500", "500"], llm, retries=2)


def test_a_refusal_or_a_garbled_stream_is_not_retried(scripted):
    llm, base = scripted
    with pytest.raises(InvalidRequest, match="bad model"):  # the LLM's refusal, in its words
        _run(base, ["400", "ok"], llm)
    with pytest.raises(LLMBadResponse, match="unreadable event"):
        _run(base, ["garbage", "ok"], llm)


def test_a_stream_cut_after_words_were_spoken_raises_instead_of_repeating(scripted):
    llm, base = scripted
    got: list[str] = []

    async def run() -> None:
        client = LLMClient(LLMConfig(base))
        try:
            async for delta in client.stream([{"role": "user", "content": "hi"}]):
                got.append(delta)
        finally:
            await client.aclose()

    llm.script = ["cut", "ok"]
    with pytest.raises(LLMBadResponse, match="without \\[DONE\\]"):
        asyncio.run(run())
    assert got == ["Hello", " there", ", friend."] and llm.script == ["ok"]  # no second request


def test_a_silent_server_times_out_and_a_missing_one_is_unavailable(scripted):
    llm, base = scripted
    with pytest.raises(LLMTimeout):
        _run(base, ["stall"], llm, first_token_timeout_s=0.2, retries=0)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(LLMUnavailable, match="cannot reach"):
        asyncio.run(_collect(LLMClient(LLMConfig(f"http://127.0.0.1:{port}/v1", retries=1)), []))


def test_conversation_keeps_what_was_heard():
    talk = Conversation(system="Be brief.", max_turns=1)
    talk.record("hi", "Hello th")  # the reply was cut by a barge-in
    talk.record("how are you", "Fine.")
    assert talk.messages("bye") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "how are you"},
        {"role": "assistant", "content": "Fine."},
        {"role": "user", "content": "bye"},
    ]


def test_conversation_drops_the_oldest_turns_to_fit_the_context():
    talk = Conversation(system="Be brief.", max_chars=60)
    for i in range(5):
        talk.record(f"question {i}", f"answer number {i}")  # 10 + 15 characters a turn
    sent = talk.messages("last one")  # budget 60 - 9 - 8 = 43: one turn fits
    assert [m["content"] for m in sent] == ["Be brief.", "question 4", "answer number 4", "last one"]
    assert len(talk.turns) == 10  # the record itself keeps everything
    assert Conversation(max_chars=5).messages("a long question") == [{"role": "user", "content": "a long question"}]


def test_the_history_is_cut_in_steps_so_the_prompt_start_stays_the_same_for_many_turns():
    talk = Conversation(max_turns=4)
    firsts = []
    for i in range(12):
        sent = talk.messages(f"q{i}")
        firsts.append(sent[0]["content"])
        talk.record(f"q{i}", f"a{i}")
    # past 4 turns the history drops to the newest 2, then grows to 4 again from the same first message
    assert firsts == ["q0"] * 5 + ["q3"] * 3 + ["q6"] * 3 + ["q9"]
    assert all(len(talk.messages("x")) <= 2 * 4 + 1 for _ in range(2))
