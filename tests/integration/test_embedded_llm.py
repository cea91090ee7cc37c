"""`voxgate serve`'s embedded LLM (llama.cpp + SmolLM2-135M, real) behind /v1/chat/completions,
read with the bridge's streaming client and with the official `openai` SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from voxgate.bench.server import ServerProcess
from voxgate.bridge.llm import Conversation, LLMClient, LLMConfig
from voxgate.types import InvalidRequest


@pytest.fixture(scope="module")
def llm_server() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env={"LLM_EMBEDDED": "true", "API_KEYS": "k1"}) as server:
        yield server


def test_the_bridge_client_streams_a_reply_from_the_embedded_llm(llm_server):
    async def run() -> list[str]:
        client = LLMClient(LLMConfig(llm_server.url + "/v1", api_key="k1", max_tokens=24, temperature=0))
        try:
            talk = Conversation(system="You are a helpful assistant.")
            return [d async for d in client.stream(talk.messages("Name a colour."))]
        finally:
            await client.aclose()

    deltas = asyncio.run(run())
    assert len(deltas) > 2 and "".join(deltas).strip()  # streamed token by token, real text


def test_the_openai_sdk_works_against_it(llm_server):
    client = openai.OpenAI(base_url=llm_server.url + "/v1", api_key="k1")
    stream = client.chat.completions.create(  # temperature 0: llama.cpp would sample with a random seed
        model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices).strip()


def test_auth_and_a_broken_request_give_clear_errors(llm_server):
    url = llm_server.url + "/v1/chat/completions"
    assert httpx.post(url, json={"messages": []}).status_code == 401
    hi = [{"role": "user", "content": "hi"}]
    for body, field in (({"messages": "x"}, "messages"), ({"messages": hi, "max_tokens": -5}, "max_tokens")):
        refused = httpx.post(url, json=body, headers={"authorization": "Bearer k1"})
        assert refused.status_code == 400, refused.text  # llama.cpp's status and message, voxgate's code
        error = refused.json()["error"]
        assert error["code"] == "invalid_request" and error["type"] == "invalid_request_error", error
        assert field in error["message"] and set(error) == {"message", "type", "param", "code"}

    async def run() -> None:
        client = LLMClient(LLMConfig(llm_server.url + "/v1", api_key="k1", retries=0))
        try:
            [d async for d in client.stream([{"role": "user", "content": 5}])]  # type: ignore[dict-item]
        finally:
            await client.aclose()

    with pytest.raises(InvalidRequest):  # the server's refusal, typed, not retried
        asyncio.run(run())


def test_without_an_llm_the_route_says_why():
    with ServerProcess("tone") as server:  # tests start servers without the embedded LLM
        response = httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
    assert response.status_code == 503 and response.json()["error"]["code"] == "llm_unavailable"
