"""`POST /v1/bridge/stream`: chat messages in, the LLM's reply spoken as it is written, as
server-sent events; `POST /v1/bridge/{id}/stop`: barge-in.

Events (`data: {...}` lines): `segment` {index, text, kind, trigger} when a segment starts
speaking, `audio` {segment, data (base64 16-bit PCM at `sample_rate`)}, then one `done`
{status: completed | cancelled | failed, spoken, segments, dropped, triggers, timings_ms,
code?, message?}. `timings_ms`, from the request entering the server: `llm_first_token`,
`first_segment`, `first_audio`, and after a stop `cancel_to_silence` (the stop to the last
audio written); the same go to `/metrics` as `voxgate_bridge_seconds{stage}`.
The response's `x-bridge-id` header names the reply for the stop endpoint.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from voxgate.audio import StreamEncoder
from voxgate.bridge.llm import LLMClient, LLMConfig
from voxgate.bridge.pipeline import ReplyPipeline
from voxgate.serving.protocol import error_body, parse_body
from voxgate.serving.state import ServerState
from voxgate.serving.stream import EngineStream
from voxgate.types import NotFound, SynthesisRequest, VoxgateError

router = APIRouter()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=20000)


class BridgeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    messages: list[ChatMessage] = Field(min_length=1, max_length=200)
    voice: str | None = None
    language: str | None = None
    policy: Literal["block", "latest"] = "block"
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float | None = Field(None, ge=0, le=2)


def _replies(request: Request) -> dict[str, ReplyPipeline]:
    app_state = request.app.state
    if not hasattr(app_state, "bridge_replies"):
        app_state.bridge_replies = {}
    return app_state.bridge_replies  # type: ignore[no-any-return]


@router.post("/v1/bridge/stream")
async def bridge_stream(request: Request) -> Response:
    state: ServerState = request.app.state.voxgate
    body = parse_body(BridgeBody, await request.body())
    plan = state.voice_plan(body.voice, "pcm", None, body.language)
    base = state.llm_url()
    if base is None:
        return JSONResponse(error_body("llm_unavailable", state.llm_error or "no LLM is configured"), status_code=503)
    engine = state.require_engine()
    llm = LLMClient(LLMConfig(base, max_tokens=body.max_tokens, temperature=body.temperature))

    def synthesise(text: str) -> EngineStream:
        request_ = SynthesisRequest(text=text, voice=plan.request.voice, language=plan.request.language)
        return EngineStream(engine, request_, state.executor)

    pipeline = ReplyPipeline(synthesise, policy=body.policy)
    reply_id = uuid.uuid4().hex
    replies = _replies(request)
    replies[reply_id] = pipeline
    messages = [m.model_dump() for m in body.messages]
    marks: dict[str, float] = {}
    t_in = request.scope["state"]["t_req_in"]

    async def stamped(deltas: AsyncIterator[str]) -> AsyncIterator[str]:
        async for delta in deltas:
            marks.setdefault("llm_first_token", time.perf_counter())
            yield delta

    async def events() -> AsyncIterator[bytes]:
        encoder = StreamEncoder("pcm", engine.sample_rate, plan.sample_rate)
        current, status, extra = -1, "completed", {}
        try:
            async for segment, chunk in pipeline.run(stamped(llm.stream(messages))):
                if segment.index != current:
                    current = segment.index
                    marks.setdefault("first_segment", time.perf_counter())
                    yield _event("segment", index=segment.index, text=segment.text, kind=segment.kind,
                                 trigger=segment.trigger)  # fmt: skip
                data = encoder.encode(chunk.samples)
                if data:
                    yield _event("audio", segment=segment.index, data=base64.b64encode(data).decode())
                    marks.setdefault("first_audio", time.perf_counter())
                    marks["last_audio"] = time.perf_counter()
            status = "cancelled" if pipeline.cancelled else "completed"
        except VoxgateError as exc:
            status, extra = "failed", {"code": exc.code, "message": exc.message}
        finally:
            replies.pop(reply_id, None)
            if status != "completed":
                pipeline.cancel()
            await llm.aclose()
        stats = pipeline.stats
        timings = _timings(marks, t_in, pipeline.stopped_at if status == "cancelled" else None)
        for stage, ms in timings.items():
            state.metrics.bridge.labels(stage).observe(ms / 1000)
        yield _event("done", status=status, spoken=pipeline.spoken(), segments=stats.segments, dropped=stats.dropped,
                     triggers=stats.triggers, timings_ms=timings, **extra)  # fmt: skip

    headers = {"x-bridge-id": reply_id, "x-sample-rate": str(plan.sample_rate), "cache-control": "no-store"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


@router.post("/v1/bridge/{reply_id}/stop")
async def bridge_stop(reply_id: str, request: Request) -> Response:
    """Barge-in: the reply's LLM stream and speech stop now; its stream ends with `done`."""
    pipeline = _replies(request).get(reply_id)
    if pipeline is None:
        raise NotFound(f"no reply {reply_id!r} is speaking (finished, stopped or never started)")
    pipeline.cancel()
    return JSONResponse({"stopped": reply_id, "spoken": pipeline.spoken()})


def _timings(marks: dict[str, float], t_in: float, stopped_at: float | None) -> dict[str, float]:
    """Milliseconds from the request in to each first, and from a stop to the last audio."""
    out = {k: round(1000 * (marks[k] - t_in), 2) for k in ("llm_first_token", "first_segment", "first_audio")
           if k in marks}  # fmt: skip
    if stopped_at is not None:
        out["cancel_to_silence"] = round(1000 * max(0.0, marks.get("last_audio", stopped_at) - stopped_at), 2)
    return out


def _event(event_type: str, **fields: Any) -> bytes:
    return f"data: {json.dumps({'type': event_type, **fields})}\n\n".encode()
