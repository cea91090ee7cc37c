"""`/v1/bridge/ws`: a spoken conversation over one WebSocket (the bridge's WebSocket variant).

The server keeps the conversation: each `user` message is a turn, answered by the LLM and
spoken while it is written; the history records of each reply only what was spoken (with
`played_ms` on a `cancel`, what was heard). Client messages (JSON text frames):

- `config` {system?, voice?, language?, policy?, max_tokens?, temperature?}: for the next replies.
- `user` {content}: a user turn; one arriving while a reply speaks interrupts it (barge-in).
- `cancel` {played_ms?}: stop the reply now (barge-in); `nothing_to_cancel` if none speaks.
- `reset`: forget the history; `history`: answered by `history` {messages} (what the LLM
  will see next); `ping` {id?}: answered by `pong`.

Server messages: `ready` {sample_rate}; per reply `reply.start` {reply, sample_rate}, then
`segment` {reply, index, text, kind, trigger, cached} and binary frames of 16-bit PCM for
that segment, then `done` {reply, status, spoken, ..., timings_ms}; `error` {code, message,
fatal} for a refused message (only `fatal` ones close the socket). A client that stops reading
for `send_timeout_s` is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from voxgate.bridge.llm import Conversation
from voxgate.serving.auth import Client
from voxgate.serving.limits import MessageRate, Turn
from voxgate.serving.protocol import CleanText, describe_validation
from voxgate.serving.reply import AudioOut, Reply, ReplyOptions
from voxgate.serving.state import ServerState
from voxgate.serving.wsproto import ProtocolError, decode_frame, error, message_type
from voxgate.types import VoxgateError

log = logging.getLogger(__name__)
router = APIRouter()


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Config(ReplyOptions):
    type: Literal["config"]
    system: CleanText | None = Field(None, max_length=20000)


class User(_Message):
    type: Literal["user"]
    content: CleanText = Field(min_length=1, max_length=20000)


class Cancel(_Message):
    type: Literal["cancel"]
    played_ms: float | None = Field(None, ge=0)


class Bare(_Message):
    type: Literal["reset", "history", "ping"]
    id: Annotated[str, Field(max_length=256)] | int | None = None


_ADAPTER: TypeAdapter[Config | User | Cancel | Bare] = TypeAdapter(
    Annotated[Config | User | Cancel | Bare, Field(discriminator="type")]
)
TYPES = ("config", "user", "cancel", "reset", "history", "ping")


def parse(raw: str | bytes | None, max_bytes: int) -> Config | User | Cancel | Bare:
    """One client frame -> a typed message; `ProtocolError` for anything else."""
    data = decode_frame(raw, max_bytes)
    kind = message_type(data, TYPES)
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_message", f"{kind}: {describe_validation(exc.errors())}") from None


@router.websocket("/v1/bridge/ws")
async def bridge_socket(websocket: WebSocket) -> None:
    await _Call(websocket.app.state.voxgate, websocket).serve()


class _Call:
    """One socket: a reader (this task) and at most one reply being spoken (its own task)."""

    def __init__(self, state: ServerState, websocket: WebSocket) -> None:
        self.state, self.ws = state, websocket
        self.client: Client = websocket.scope["state"]["client"]  # authenticated by RequestGate
        self.options = ReplyOptions()
        self.conversation = Conversation(max_chars=state.history_chars())
        self.reply: Reply | None = None
        self.speaker: asyncio.Task[None] | None = None
        self.replies = 0
        self.send_lock = asyncio.Lock()

    async def serve(self) -> None:
        ws, settings = self.ws, self.state.settings
        await ws.accept()
        try:
            self.state.sessions.open(self.client.id)  # a bridge socket is a session of its client
        except VoxgateError as exc:
            await self._refuse(error(exc.code, exc.message, fatal=True))
            return
        rate = MessageRate(settings.ws_messages_per_s, settings.ws_message_burst)
        turn = Turn()
        try:
            await self._send({"type": "ready", "sample_rate": self.state.require_engine().sample_rate})
            while True:
                frame = await ws.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                raw = frame.get("text") if frame.get("text") is not None else frame.get("bytes")
                try:
                    if not rate.take(time.monotonic(), len(raw or b"")):
                        raise ProtocolError("rate_limited", "too many messages; the socket is closed", fatal=True)
                    await self._apply(parse(raw, settings.ws_max_message_bytes))
                except (ProtocolError, VoxgateError) as exc:
                    reply = exc.to_message() if isinstance(exc, ProtocolError) else error(exc.code, exc.message)
                    self.state.metrics.errors.labels(reply["code"]).inc()
                    if reply["fatal"]:
                        await self._refuse(reply)
                        break
                    await self._send(reply)
                await turn.end()  # frames already queued return without yielding: let others run
        except (WebSocketDisconnect, OSError, TimeoutError, RuntimeError):  # gone (starlette: RuntimeError)
            pass
        except Exception:  # a bug must cost this socket only
            log.exception("bridge socket failed")
        finally:
            await self._interrupt(None)
            self.state.sessions.close(self.client.id)

    async def _refuse(self, reply: dict[str, Any]) -> None:
        """A fatal error: stop the reply, say why, close."""
        await self._interrupt(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._send(reply), timeout=1.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(code=1008, reason=reply["code"]), timeout=1.0)

    async def _apply(self, message: Config | User | Cancel | Bare) -> None:
        if isinstance(message, Config):
            options = ReplyOptions(**message.model_dump(exclude={"type", "system"}))
            self.state.voice_plan(
                options.voice, "pcm", None, options.language, client=self.client.id
            )  # refused: no change
            self.options = options
            if message.system is not None:
                self.conversation.system = message.system or None
        elif isinstance(message, User):
            await self._interrupt(None)
            await self._start(message.content)
        elif isinstance(message, Cancel):
            if self.reply is None:
                raise ProtocolError("nothing_to_cancel", "no reply is speaking")
            await self._interrupt(message.played_ms)
        elif message.type == "reset":
            self.conversation.turns.clear()
        elif message.type == "history":
            system = [{"role": "system", "content": self.conversation.system}] if self.conversation.system else []
            await self._send({"type": "history", "messages": [*system, *self.conversation.turns]})
        else:
            await self._send({"type": "pong", "id": message.id})

    async def _start(self, user: str) -> None:
        """`reply.start` goes out before the next message is read (a `ping` sent after a `user`
        is answered after its `reply.start`), then the reply speaks on a task of its own."""
        self.replies += 1
        reply = Reply(self.state, self.options, self.conversation.messages(user), time.perf_counter(),
                      self.client.id)  # fmt: skip
        try:
            await self._send({"type": "reply.start", "reply": self.replies, "sample_rate": reply.plan.sample_rate})
        except BaseException:
            reply.close()
            raise
        self.reply = reply
        self.speaker = asyncio.get_running_loop().create_task(self._speak(reply, self.replies, user))

    async def _speak(self, reply: Reply, number: int, user: str) -> None:
        recorded = False
        try:
            async for event in reply.events():
                if isinstance(event, AudioOut):
                    await self._send(event.pcm)
                    continue
                message = {**event.message(), "reply": number}
                if message["type"] == "done":  # the history has the turn before the client hears it is over
                    self.conversation.record(user, reply.spoken())
                    recorded = True
                    if self.reply is reply:  # over once `done` is out: a `cancel` now is `nothing_to_cancel`
                        self.reply = None
                await self._send(message)
        except (WebSocketDisconnect, OSError, RuntimeError, TimeoutError):
            with contextlib.suppress(Exception):  # a client that stopped reading or left: drop it
                await self.ws.close(code=1011)
        finally:
            reply.close()
            if not recorded:
                self.conversation.record(user, reply.spoken())
            if self.reply is reply:
                self.reply = None

    async def _interrupt(self, played_ms: float | None) -> None:
        """Stop the reply speaking now, if any, and wait for its task to end (its `done` sent)."""
        reply, speaker = self.reply, self.speaker
        if speaker is None or speaker.done():
            return
        if reply is not None:  # None: finished, its `done` on the way
            reply.stop(played_ms)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(speaker), timeout=self.state.settings.send_timeout_s)
        if not speaker.done():
            speaker.cancel()

    async def _send(self, message: dict[str, Any] | bytes) -> None:
        """One message, at most `send_timeout_s` behind a client that does not read (the reader
        waits here too, so nothing queues without bound). JSON is ASCII-escaped: any string
        it carries encodes."""
        async with self.send_lock:
            data = message if isinstance(message, bytes) else json.dumps(message)
            send = self.ws.send_bytes(data) if isinstance(data, bytes) else self.ws.send_text(data)
            await asyncio.wait_for(send, timeout=self.state.settings.send_timeout_s)
