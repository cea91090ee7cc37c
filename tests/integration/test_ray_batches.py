"""An HTTP stream as a Ray Serve replica sends it: the real app (tone engine) writing into Ray's
own `MessageQueue`, consumed the way a replica that runs the app on its own event loop does
(`cluster/deployment.py` sets that), each batch it takes being one message of Ray's streaming
call to the proxy. No Ray cluster: the batching is the property under test, not Ray's transport.

The pieces of a chunk were ready together, so they travel in one Ray message (on 2x H200 one
message a 40 ms piece made a burst of 64 streams 2.6x slower through Ray); every byte arrives,
in order; a piece that can go is never held back for the engine's next chunk."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from voxgate.audio import pcm16_bytes
from voxgate.config import Settings
from voxgate.engines.base import collect
from voxgate.engines.tone import ToneEngine
from voxgate.serving.app import create_app
from voxgate.types import AudioChunk, CancelToken, SynthesisRequest

pytest.importorskip("ray.serve")
from ray.serve._private.http_util import MessageQueue  # Ray's replica-side queue

UNIT_MS = 400  # one tone unit (one engine chunk): ten 40 ms pieces, more than Ray's queue takes per loop turn
UNIT_BYTES = 24000 * 2 * UNIT_MS // 1000  # pcm16 at 24 kHz
GUARD_S = 60.0  # only against a hang: no assertion here depends on how long anything takes


class GatedTone(ToneEngine):
    """Tone that makes its second chunk only once `gate` is set (one chunk a unit, no joining)."""

    def __init__(self) -> None:
        super().__init__(unit_ms=UNIT_MS, delay_ms=1)
        self.gate = threading.Event()

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        for i, chunk in enumerate(super().stream(request, cancel)):
            if i == 1 and not self.gate.wait(GUARD_S):
                return
            yield chunk


@asynccontextmanager
async def replica_app(engine: ToneEngine | None = None) -> Any:
    settings = Settings(engine="tone", warmup=False, starter_cache=False, llm_embedded=False, agent_max_calls=0)
    app = create_app(settings, engine=engine or ToneEngine(unit_ms=UNIT_MS))
    async with app.router.lifespan_context(app):
        async with asyncio.timeout(GUARD_S):
            while not app.state.voxgate.ready:
                await asyncio.sleep(0.01)
        yield app


async def ray_messages(
    app: Any, text: str, on_message: Callable[[list[dict]], None] = lambda _: None
) -> list[list[dict]]:
    """POST /tts/stream through Ray's queue: the ASGI messages of each Ray message."""
    body = json.dumps({"text": text}).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/tts/stream", "raw_path": b"/tts/stream", "query_string": b"", "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip
    requested, stays = False, asyncio.Event()

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": body, "more_body": False}
        await stays.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    queue = MessageQueue()
    call = asyncio.ensure_future(app(scope, receive, queue))
    messages = []
    async with asyncio.timeout(GUARD_S):
        async for batch in queue.fetch_messages_from_queue(call):
            messages.append(batch)
            on_message(batch)
    return messages


def tone_pcm(text: str) -> bytes:
    return pcm16_bytes(collect(ToneEngine(unit_ms=UNIT_MS), SynthesisRequest(text=text, voice="tone")).samples)


def audio(batch: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in batch if m["type"] == "http.response.body")


def test_a_chunks_pieces_travel_in_one_ray_message_and_every_byte_arrives_in_order() -> None:
    text = " ".join(f"word{i}" for i in range(12))

    async def run() -> list[list[dict]]:
        async with replica_app() as app:
            return await ray_messages(app, text)

    messages = asyncio.run(run())
    assert b"".join(audio(m) for m in messages) == tone_pcm(text)
    pieces = [m for batch in messages for m in batch if m["type"] == "http.response.body" and m["body"]]
    assert len(pieces) == 12 * 10 and all(len(p["body"]) == UNIT_BYTES // 10 for p in pieces)  # still 40 ms pieces
    assert messages[0][0]["type"] == "http.response.start" and audio(messages[0])  # first audio in the first message
    ends, total = [], 0
    for batch in messages:
        total += len(audio(batch))
        ends.append(total)
    assert all(end % UNIT_BYTES == 0 for end in ends)  # no chunk split across Ray messages
    assert len([m for m in messages if audio(m)]) <= 12  # at most one Ray message a chunk, not one a piece


def test_a_piece_that_can_go_is_not_held_for_the_engines_next_chunk() -> None:
    engine = GatedTone()
    text = "first second third"

    def release_when_first_chunk_is_out(batch: list[dict], seen: list[int] = [0]) -> None:  # noqa: B006
        seen[0] += len(audio(batch))
        if seen[0] >= UNIT_BYTES:  # the first chunk reached the proxy while the second was not made yet
            engine.gate.set()

    async def run() -> list[list[dict]]:
        async with replica_app(engine) as app:
            return await ray_messages(app, text, release_when_first_chunk_is_out)

    messages = asyncio.run(run())
    assert engine.gate.is_set()
    assert b"".join(audio(m) for m in messages) == tone_pcm(text)
