"""`/v1/bridge/ws`'s reader and speaker with a scripted socket and reply: no server, no engine."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from voxgate.serving import bridge_ws


class _Reply:
    """A reply that is over at once: its only event is `done`."""

    def __init__(self, *args: Any) -> None:
        self.plan = SimpleNamespace(sample_rate=16000)

    async def events(self):
        yield SimpleNamespace(message=lambda: {"type": "done", "status": "completed", "spoken": "Hi."})

    def stop(self, played_ms: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass

    def spoken(self) -> str:
        return "Hi."


class _Socket:
    """A client that sends `cancel` (then `ping`, then leaves) the moment it receives `done`:
    the reader takes the `cancel` while the `done` is still being sent."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps({"type": "user", "content": "Hi"})})
        self.cancel_taken = asyncio.Event()
        self.sent: list[dict[str, Any]] = []
        self.scope = {"state": {"client": SimpleNamespace(id="c")}}

    async def accept(self) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        frame = await self.inbox.get()
        if '"cancel"' in frame.get("text", ""):
            self.cancel_taken.set()
        return frame

    async def send_text(self, data: str) -> None:
        message = json.loads(data)
        self.sent.append(message)
        if message["type"] == "done":
            for text in (json.dumps({"type": "cancel"}), json.dumps({"type": "ping", "id": 1})):
                self.inbox.put_nowait({"type": "websocket.receive", "text": text})
            self.inbox.put_nowait({"type": "websocket.disconnect"})
            await self.cancel_taken.wait()  # `done` is on its way until the reader has the cancel

    async def close(self, code: int = 1000, reason: str = "") -> None:
        pass


def _state() -> SimpleNamespace:
    settings = SimpleNamespace(ws_messages_per_s=100.0, ws_message_burst=100, ws_max_message_bytes=65536,
                               send_timeout_s=5.0)  # fmt: skip
    return SimpleNamespace(
        settings=settings,
        sessions=SimpleNamespace(open=lambda client: None, close=lambda client: None),
        metrics=SimpleNamespace(errors=SimpleNamespace(labels=lambda code: SimpleNamespace(inc=lambda: None))),
        require_engine=lambda: SimpleNamespace(sample_rate=16000),
        history_chars=lambda: 10000,
    )


def test_a_cancel_sent_upon_done_is_answered_nothing_to_cancel(monkeypatch):
    monkeypatch.setattr(bridge_ws, "Reply", _Reply)
    socket = _Socket()
    asyncio.run(asyncio.wait_for(bridge_ws._Call(_state(), socket).serve(), 10))
    kinds = [(m["type"], m.get("code")) for m in socket.sent]
    assert kinds == [
        ("ready", None),
        ("reply.start", None),
        ("done", None),
        ("error", "nothing_to_cancel"),
        ("pong", None),
    ]
