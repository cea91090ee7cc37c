"""A WebSocket TTS test client that records every message (shared by the gateway tests)."""

from __future__ import annotations

import asyncio
import json

import websockets


class Client:
    """A test client that records every message (audio headers joined to their bytes)."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.messages: list[dict] = []
        self.units = 0

    async def send(self, **message) -> None:
        await self.ws.send(json.dumps(message))

    async def words(self, text: str) -> None:
        for word in text.split():
            await self.send(type="text.delta", text=word + " ", first_unit_index=self.units)
            self.units += 1

    async def next(self, timeout: float = 30.0) -> dict:
        message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        if message["type"] == "audio" and "data" not in message:
            payload = await asyncio.wait_for(self.ws.recv(), timeout)
            assert isinstance(payload, bytes) and len(payload) == message["bytes"]
            message["payload"] = payload
        self.messages.append(message)
        return message

    async def until(self, kind: str, timeout: float = 30.0) -> dict:
        while (message := await self.next(timeout))["type"] != kind:
            pass
        return message

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m["type"] == kind]

    async def start(self, **config) -> dict:
        await self.send(type="session.start", **config)
        return await self.next()
