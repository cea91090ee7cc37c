"""`/v1/bridge/ws` on a real server: the embedded LLM writes, Piper speaks, over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import websockets

from tests.conftest import metric, wait_for
from voxgate.bench.server import ServerProcess

ASK = "Tell me a short story about a cat and a boat."


def _url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/bridge/ws"


class Call:
    """Records every message; binary frames are counted against the segment they follow."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.messages: list[dict] = []
        self.audio_bytes = 0

    async def send(self, **message) -> None:
        await self.ws.send(json.dumps(message))

    async def next(self, timeout: float = 60.0) -> dict:
        """The next message; a binary frame comes as {"type": "audio", "bytes": n}."""
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        if isinstance(frame, bytes):
            assert len(frame) % 2 == 0 and self.messages[-1]["type"] in ("segment", "audio")
            self.audio_bytes += len(frame)
            message = {"type": "audio", "bytes": len(frame)}
        else:
            message = json.loads(frame)
        self.messages.append(message)
        return message

    async def until(self, kind: str) -> dict:
        while (message := await self.next())["type"] != kind:
            pass
        return message


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 180))


@contextlib.asynccontextmanager
async def _call(server: ServerProcess, ask: str | None = None, **config) -> AsyncIterator[Call]:
    """A connected call past `ready`, configured, and with `ask` sent as the first user turn."""
    async with websockets.connect(_url(server)) as ws:
        call = Call(ws)
        assert (await call.next())["type"] == "ready"
        if config:
            await call.send(type="config", **config)
        if ask:
            await call.send(type="user", content=ask)
        yield call


def test_a_spoken_conversation_keeps_its_history_on_the_server(bridge):
    async def run() -> None:
        question = "What is the capital of France?"
        async with _call(bridge, question, system="Answer in one sentence.", max_tokens=30, temperature=0) as call:
            ready = call.messages[0]
            assert ready["sample_rate"] > 0
            start = await call.next()
            assert start == {"type": "reply.start", "reply": 1, "sample_rate": ready["sample_rate"]}
            done = await call.until("done")
            assert done["reply"] == 1 and done["status"] == "completed" and call.audio_bytes > 0
            segments = [m for m in call.messages if m["type"] == "segment"]
            assert segments[0]["kind"] == "starter" and all(s["reply"] == 1 for s in segments)
            await call.send(type="user", content="And of Italy?")
            assert (await call.until("done"))["reply"] == 2
            await call.send(type="history")
            history = (await call.until("history"))["messages"]
            assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant"]
            assert history[2]["content"] == done["spoken"] and history[3]["content"] == "And of Italy?"
            await call.send(type="reset")
            await call.send(type="history")
            assert (await call.until("history"))["messages"] == [
                {"role": "system", "content": "Answer in one sentence."}
            ]

    _run(run())


def test_cancel_stops_the_reply_and_only_what_was_heard_enters_the_history(bridge):
    async def run() -> None:
        async with _call(bridge, ASK, max_tokens=80, temperature=0) as call:
            await call.until("audio")
            await call.send(type="cancel", played_ms=0)
            done = await call.until("done")
            assert done["status"] == "cancelled" and done["spoken"] == ""
            assert done["timings_ms"]["cancel_to_silence"] < 1000
            after = len(call.messages)
            await call.send(type="ping", id=7)
            assert await call.next() == {"type": "pong", "id": 7}  # no audio after the done
            assert len(call.messages) == after + 1
            await call.send(type="history")
            history = (await call.until("history"))["messages"]
            assert history == [{"role": "user", "content": ASK}, {"role": "assistant", "content": ""}]

    _run(run())


def test_a_new_user_turn_interrupts_the_reply_speaking(bridge):
    async def run() -> None:
        async with _call(bridge, ASK, max_tokens=80, temperature=0) as call:
            await call.until("segment")
            await call.send(type="user", content="Stop. Say hello instead.")
            first = await call.until("done")
            assert first["reply"] == 1 and first["status"] == "cancelled" and first["spoken"]
            assert (await call.until("reply.start"))["reply"] == 2
            assert (await call.until("done"))["status"] == "completed"

    _run(run())


def test_bad_messages_get_typed_errors_and_the_socket_stays_usable(bridge):
    async def run() -> None:
        async with _call(bridge) as call:
            ws = call.ws
            cases = [
                ("{nope", "invalid_message"),
                (json.dumps({"type": "shout"}), "unknown_type"),
                (json.dumps({"type": "user"}), "invalid_message"),
                (json.dumps({"type": "user", "content": ""}), "invalid_message"),
                (json.dumps({"type": "config", "policy": "sometimes"}), "invalid_message"),
                (json.dumps({"type": "config", "voice": "nobody"}), "unknown_voice"),
                (json.dumps({"type": "cancel"}), "nothing_to_cancel"),
                (json.dumps({"type": "cancel", "played_ms": -5}), "invalid_message"),
                (json.dumps({"type": "user", "content": "x" * 65_600}), "message_too_large"),  # within the parser slack
                (b"\x00\x01", "binary_not_supported"),
                ("[1, 2]", "invalid_message"),
                (json.dumps({"content": "no type"}), "invalid_message"),
            ]
            for raw, code in cases:
                await ws.send(raw)
                message = await call.next()
                assert message["type"] == "error" and message["code"] == code and not message["fatal"], raw
            await call.send(type="ping")
            assert (await call.next())["type"] == "pong"

    _run(run())


def test_a_client_that_leaves_mid_reply_frees_its_stream(bridge):
    async def run() -> None:
        async with _call(bridge, ASK) as call:
            await call.until("segment")

    _run(run())
    assert wait_for(lambda: metric(bridge, "voxgate_active_streams") == 0)  # freed once the server sees the close
    assert httpx.get(bridge.url + "/healthz").status_code == 200


def test_a_reply_starts_before_the_next_message_is_answered(bridge):
    """Twenty (`user`, `ping`) pairs in one burst: each `pong` comes after its turn's
    `reply.start` (a client may use a ping as a barrier: every turn sent before it has
    started). Before, the reader answered a ping queued behind a turn before the turn's reply
    task had sent `reply.start` (the socket fuzzer's 150-turn flood caught it under load)."""

    async def run() -> list[dict]:
        async with _call(bridge) as call:
            for n in range(20):
                await call.ws.send(json.dumps({"type": "user", "content": f"{ASK} ({n})"}))
                await call.ws.send(json.dumps({"type": "ping", "id": n}))
            while (m := await call.next())["type"] != "pong" or m["id"] != 19:
                pass
            await call.send(type="cancel")
            await call.until("done")
            return call.messages

    messages = _run(run())
    for n in range(20):
        at = next(i for i, m in enumerate(messages) if m["type"] == "pong" and m["id"] == n)
        assert sum(m["type"] == "reply.start" for m in messages[:at]) == n + 1, f"pong {n} overtook its turn"
