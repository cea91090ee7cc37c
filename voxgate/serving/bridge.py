"""`POST /v1/bridge/stream`: chat messages in, the LLM's reply spoken as it is written;
`POST /v1/bridge/{id}/stop`: barge-in. (The WebSocket variant is `serving/bridge_ws.py`.)

The body: `messages` (chat format) and the reply options `voice`, `language`, `policy`
(block | latest), `max_tokens`, `temperature`, `pacing` (send audio in real time, at most
`pacing_lead_ms` ahead, so a stop leaves little buffered at the client).
The response is server-sent events by default (`data: {...}` lines): `segment` {index, text,
kind, trigger, cached} when a segment starts speaking, `audio` {segment, data (base64 16-bit
PCM at the `x-sample-rate` header's rate)}, then one `done` {status, spoken, segments,
dropped, queue_peak, triggers, starter_cached, timings_ms, unspeakable, code?, message?}. With
`Accept: multipart/mixed` the same come as parts: JSON parts for `segment` and `done`, and
`audio/L16` parts of raw PCM with an `X-Segment` header; every part has a Content-Length.
The `x-bridge-id` header names the reply for the stop endpoint, whose optional JSON body
`{"played_ms": n}` says how much audio the client played, so `spoken` is what was heard.
The reply waits for its LLM slot (the fair LLM limiter, `serving/llm.py`) before the response
starts: a full queue or a long wait is a 503 `busy`. A client that stops reading for
`VOXGATE_SEND_TIMEOUT_S` is dropped and its reply stopped, as on `/tts/stream`.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from voxgate.serving.http import client_of
from voxgate.serving.llm import LLM_ERRORS, llm_slot
from voxgate.serving.openapi import BINARY, errors, json_body, sse, streamed
from voxgate.serving.protocol import CleanText, fields_at_fault, parse_body
from voxgate.serving.reply import AudioOut, Reply, ReplyDone, ReplyOptions, SegmentStarted
from voxgate.serving.state import ServerState
from voxgate.serving.stream import bounded, drop_slow_reader
from voxgate.types import NotFound

router = APIRouter()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: CleanText = Field(max_length=20000)


class BridgeBody(ReplyOptions):
    messages: list[ChatMessage] = Field(min_length=1, max_length=200)


class StopBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    played_ms: float | None = Field(None, ge=0, description="how much of the reply the client played")


class Stopped(BaseModel):
    stopped: str = Field(description="the reply's id")
    spoken: str = Field(description="the text handed out, or with played_ms the text the listener heard")


def replies(app_state: Any) -> dict[str, Reply]:
    """The replies speaking now, by id (shared with the WebSocket variant for stops)."""
    if not hasattr(app_state, "bridge_replies"):
        app_state.bridge_replies = {}
    return app_state.bridge_replies  # type: ignore[no-any-return]


_EVENT = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"enum": ["segment", "audio", "done"]}},
    "description": "segment {index, text, kind, trigger, cached}; audio {segment, data: base64 16-bit PCM}; "
    "done {status, spoken, segments, dropped, queue_peak, triggers, starter_cached, timings_ms, unspeakable, "
    "code?, message?}",
}


@router.post(
    "/v1/bridge/stream",
    response_class=Response,
    openapi_extra=json_body(BridgeBody),
    responses={
        200: streamed(
            "the reply as it is spoken: server-sent events (segment, audio, done), or with "
            "`Accept: multipart/mixed` the same as parts (JSON, and audio/L16 with X-Segment)",
            {"text/event-stream": sse(_EVENT), "multipart/mixed": BINARY},
            ("x-bridge-id", "x-sample-rate"),
        ),
        **errors({
            400: "invalid_request, unknown_voice, unsupported_language",
            429: "too_many_streams: this client has VOXGATE_MAX_STREAMS_PER_CLIENT streams open",
            503: f"{LLM_ERRORS[503]}; busy: the server has VOXGATE_MAX_STREAMS streams open; not_ready",
        }),
    },
)  # fmt: skip
async def bridge_stream(request: Request) -> Response:
    state: ServerState = request.app.state.voxgate
    body = parse_body(BridgeBody, await request.body())
    options = ReplyOptions(**body.model_dump(exclude={"messages"}))
    messages = [m.model_dump() for m in body.messages]
    scope = request.scope["state"]
    with fields_at_fault({"unknown_voice": "voice", "unsupported_language": "language"}):
        reply = Reply(state, options, messages, scope["t_req_in"], scope["client_id"])
    try:
        lease = await llm_slot(state, request)
    except BaseException:
        reply.close()
        raise
    if lease is None:  # the client left while waiting
        reply.close()
        return Response(status_code=499)
    reply.hold(lease)
    reply_id = uuid.uuid4().hex
    live = replies(request.app.state)
    live[reply_id] = reply
    headers = {"x-bridge-id": reply_id, "x-sample-rate": str(reply.plan.sample_rate), "cache-control": "no-store"}
    multipart = "multipart/mixed" in request.headers.get("accept", "")
    if multipart:
        boundary = "voxgate-" + uuid.uuid4().hex
        body_iter, media_type = _parts(reply, boundary), f"multipart/mixed; boundary={boundary}"
    else:
        body_iter, media_type = _sse(reply), "text/event-stream"
    return _ReplyResponse(reply, lambda: live.pop(reply_id, None), body_iter, media_type=media_type, headers=headers)


@router.post(
    "/v1/bridge/{reply_id}/stop",
    openapi_extra=json_body(StopBody, required=False),
    responses={
        200: {"model": Stopped},
        **errors(
            {400: "invalid_request: the body is not valid", 404: "not_found: no such reply of this client is speaking"}
        ),
    },
)
async def bridge_stop(reply_id: str, request: Request) -> Response:
    """Barge-in: the reply's LLM stream and speech stop now; its stream ends with `done`. Only the
    client that started the reply may stop it (and read what was spoken)."""
    raw = await request.body()
    body = parse_body(StopBody, raw) if raw.strip() else StopBody()
    reply = replies(request.app.state).get(reply_id)
    if reply is None or reply.client != client_of(request):  # another client's reply: as if none
        raise NotFound(f"no reply {reply_id!r} is speaking (finished, stopped or never started)")
    reply.stop(body.played_ms)
    return JSONResponse({"stopped": reply_id, "spoken": reply.spoken()})


class _ReplyResponse(StreamingResponse):
    """Frees the reply's slot even when the client leaves before its body starts, and gives up
    on a client that stops reading for `send_timeout_s` (as `/tts/stream` does): the reply is
    stopped and its connection dropped."""

    def __init__(self, reply: Reply, forget: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reply, self.forget = reply, forget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        timeout_s = self.reply.state.settings.send_timeout_s
        try:
            await super().__call__(scope, receive, bounded(send, timeout_s))
        except* TimeoutError:
            drop_slow_reader(scope, timeout_s)
        finally:
            self.forget()
            self.reply.close()


async def _sse(reply: Reply) -> AsyncIterator[bytes]:
    async for event in reply.events():
        if isinstance(event, AudioOut):
            message = {"type": "audio", "segment": event.segment, "data": base64.b64encode(event.pcm).decode()}
        else:
            message = event.message()
        yield f"data: {json.dumps(message)}\n\n".encode()


async def _parts(reply: Reply, boundary: str) -> AsyncIterator[bytes]:
    rate = reply.plan.sample_rate
    async for event in reply.events():
        if isinstance(event, AudioOut):
            head, data = f"Content-Type: audio/L16; rate={rate}; channels=1\r\nX-Segment: {event.segment}", event.pcm
        else:
            assert isinstance(event, SegmentStarted | ReplyDone)
            head, data = "Content-Type: application/json", json.dumps(event.message()).encode()
        yield f"--{boundary}\r\n{head}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data + b"\r\n"
    yield f"--{boundary}--\r\n".encode()
