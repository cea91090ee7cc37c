"""A stand-in OpenAI-compatible LLM on loopback (real HTTP, run in a thread) for tests that
need an LLM answer without the embedded model's cost, or one whose timing the test controls."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.conftest import wait_for

# llama.cpp's answer to `{"messages": "oops"}`, as its server sends it.
LLAMA_CPP_REFUSAL = {"error": {"code": 400, "message": "Expected 'messages' to be an array",
                               "type": "invalid_request_error"}}  # fmt: skip
# vLLM's answer to a prompt over the model's context, as its server sends it.
VLLM_TOO_LONG = {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                 "message": "This model's maximum context length is 2048 tokens. However, you requested 9000 tokens "
                            "(8000 in the messages, 1000 in the completion). Please reduce the length."}  # fmt: skip


class SlowLLM:
    """A stand-in LLM server (real HTTP on loopback, run in a thread): records the last user
    message of each request as it arrives, then streams `tokens` words once the gate is open.
    A user message starting with `fail` gets a 500 naming an internal address, one starting with
    `long` vLLM's refusal of a prompt over its context (400); `messages` that is not a list,
    llama.cpp's refusal (400, with its integer `code`)."""

    def __init__(self, tokens: int = 5, opening: str = "") -> None:
        self.tokens, self.opening = tokens, opening  # `opening`: a first delta before the words
        self.arrived: list[str] = []
        self.hung_up: list[str] = []  # answers whose reader (voxgate) left mid-stream
        self.loop: asyncio.AbstractEventLoop | None = None
        self._gate: asyncio.Event | None = None

    def hold(self) -> None:
        self._call(lambda gate: gate.clear())

    def release(self) -> None:
        self._call(lambda gate: gate.set())

    def _call(self, action) -> None:
        assert self.loop is not None
        done = threading.Event()
        self.loop.call_soon_threadsafe(lambda: (action(self._gate), done.set()))
        assert done.wait(10)

    async def completions(self, request: Request):
        if self._gate is None:
            self.loop, self._gate = asyncio.get_running_loop(), asyncio.Event()
            self._gate.set()
        messages = (await request.json())["messages"]
        if not isinstance(messages, list):
            return JSONResponse(LLAMA_CPP_REFUSAL, status_code=400)
        content = messages[-1]["content"]
        self.arrived.append(content)
        if content.startswith("fail"):
            return JSONResponse({"error": "upstream http://10.9.8.7:9000 is down"}, status_code=500)
        if content.startswith("long"):
            return JSONResponse(VLLM_TOO_LONG, status_code=400)
        return StreamingResponse(self._answer(content), media_type="text/event-stream")

    async def _answer(self, content: str):
        finished = False
        try:
            yield ": opening\n\n"
            assert self._gate is not None
            await self._gate.wait()
            if self.opening:
                yield "data: " + json.dumps({"choices": [{"delta": {"content": self.opening}}]}) + "\n\n"
            for i in range(self.tokens):
                yield "data: " + json.dumps({"choices": [{"delta": {"content": f"word{i}. "}}]}) + "\n\n"
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                self.hung_up.append(content)


@contextmanager
def serve_llm(llm: SlowLLM) -> Iterator[tuple[SlowLLM, str]]:
    """Run `llm` on a free loopback port; yields (llm, its OpenAI base URL)."""
    app = Starlette(routes=[Route("/v1/chat/completions", llm.completions, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, timeout=30)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    httpx.post(url + "/chat/completions", json={"messages": [{"role": "user", "content": "warm"}]}, timeout=30)
    try:
        yield llm, url
    finally:
        server.should_exit = True
        thread.join(10)
