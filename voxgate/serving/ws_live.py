"""A WebSocket TTS session with its I/O (`Live`), and the few ways the gateway ends a socket:
what `voxgate.serving.ws` drives."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect

from voxgate.bridge.pipeline import ChunkStream
from voxgate.serving.omni import OmniFraming
from voxgate.serving.session import Session
from voxgate.serving.state import StreamPlan
from voxgate.speech.clock import PlaybackClock

CONTROL_BYTES = 256 << 10  # replies (pongs, errors) and other small messages a client may leave unread


@dataclass(eq=False)
class Live:
    """A session with its I/O: the attached socket (if any), its wake-ups and tasks."""

    session: Session
    plan: StreamPlan
    owner: str  # the client identity that opened it (voxgate.serving.auth.Client.id)
    resume_token: str  # given only to the socket that opened it; a resume must show it
    socket: WebSocket | None = None
    replies: deque[str] = field(default_factory=deque)  # JSON, sent before the log, never replayed
    reply_bytes: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the writer has something to send
    work: asyncio.Event = field(default_factory=asyncio.Event)  # the synthesiser has something to do
    room: asyncio.Event = field(default_factory=asyncio.Event)  # the send queue drained a little
    stream: ChunkStream | None = None
    writer: asyncio.Task[None] | None = None
    synth: asyncio.Task[None] | None = None
    detached_at: float | None = None
    reserved: bool = False  # holds one of the engine's voices (speech/limits.py): while a socket is attached
    clock: PlaybackClock = field(default_factory=PlaybackClock)  # the listener's: audio written (deadlines, pacing)
    dropped: str | None = None  # why the last socket was dropped, told on resume
    parked: bool = False  # nobody listens and its output is full: synthesis waits for a resume
    close_code: int | None = None  # the writer closes the socket with this once its replies are out
    omni: OmniFraming | None = None  # vLLM-Omni's framing (its path, /v1/audio/speech/stream)

    def reply(self, message: dict[str, Any]) -> None:
        text = json.dumps(message)  # ASCII-escaped: whatever a string holds, it encodes
        self.replies.append(text)
        self.reply_bytes += len(text)
        self.wake.set()

    def unread_bytes(self) -> int:
        """What this session holds for its client, unsent: replies and the log."""
        return self.reply_bytes + self.session.unsent_bytes


def abort(websocket: WebSocket) -> None:
    """Drop the connection now. A client that does not read cannot take a close frame (it
    would wait behind megabytes of audio), so the TCP connection is aborted where the ASGI
    server lets us (`RequestGate` records how), else closed."""
    abort = websocket.scope.get("state", {}).get("abort_transport")
    if abort is not None:
        abort()
    else:
        asyncio.get_running_loop().create_task(close_quietly(websocket, 1013, "backpressure"))


async def send_now(websocket: WebSocket, reply: dict[str, Any]) -> None:
    """A reply from the reader, on a socket with no session attached (nothing else writes to
    it). The socket may have been closed while frames already read still waited for the reader:
    by uvicorn itself (invalid UTF-8, an oversized frame) or by the session's writer (after
    session.done). Sending then raises RuntimeError: the connection is over, not our failure."""
    try:
        await websocket.send_text(json.dumps(reply))
    except RuntimeError:
        raise WebSocketDisconnect(1006) from None


async def send_then_close(websocket: WebSocket, reply: dict[str, Any], code: int = 1008) -> None:
    """A fatal error: tell the client why (if it reads within a second), then close."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(websocket.send_text(json.dumps(reply)), timeout=1.0)
    await close_quietly(websocket, code, reply["code"])


async def close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(websocket.close(code=code, reason=reason), timeout=1.0)
