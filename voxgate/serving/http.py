"""HTTP routes: /tts/stream, OpenAI-compatible /v1/audio/speech, voices, health, metrics."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from voxgate.audio import StreamEncoder, split_bytes
from voxgate.serving.protocol import SpeechBody, TTSStreamBody, error_of, parse_body
from voxgate.serving.starter import StarterHit
from voxgate.serving.state import ServerState, StreamPlan
from voxgate.serving.stream import AudioStreamResponse, EngineStream, StreamOutcome
from voxgate.text import count_units
from voxgate.types import AudioChunk, InvalidRequest, Timing, UnknownModel, UnsupportedFormat, VoxgateError

router = APIRouter()
OPENAI_RATE = 24000  # OpenAI's pcm is 24 kHz, 16-bit, mono
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxgate")
_REQUEST_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def state_of(request: Request) -> ServerState:
    return request.app.state.voxgate  # type: ignore[no-any-return]


def request_id_of(request: Request) -> str:
    """The client's x-request-id when it is sane (<= 128 safe characters), else a new one."""
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and set(given) <= _REQUEST_ID_CHARS:
        return given
    return uuid.uuid4().hex


def _json_body(model: type) -> dict[str, Any]:
    """OpenAPI description of a body that the route parses itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


@router.post("/tts/stream", openapi_extra=_json_body(TTSStreamBody))
async def tts_stream(request: Request) -> Response:
    """Stream speech for `text` as chunked audio (pcm16, wav or 8 kHz mu-law)."""
    state = state_of(request)
    body = parse_body(TTSStreamBody, await request.body())
    plan = state.plan(
        text=body.text,
        voice=body.voice,
        language=body.language,
        fmt=body.format,
        sample_rate=body.sample_rate,
        speed=body.speed,
        request_id=request_id_of(request),
    )
    return await open_stream(state, request, plan, endpoint="tts_stream", sse=False)


@router.post("/v1/audio/speech", openapi_extra=_json_body(SpeechBody))
async def audio_speech(request: Request) -> Response:
    """OpenAI-compatible speech: chunked audio, or SSE with `stream_format: "sse"`."""
    state = state_of(request)
    body = parse_body(SpeechBody, await request.body())
    engine = state.require_engine()
    if body.model not in (*OPENAI_MODELS, engine.name):
        raise UnknownModel(f"unknown model {body.model!r}; use one of {', '.join((*OPENAI_MODELS, engine.name))}")
    if body.stream_format not in ("audio", "sse"):
        raise InvalidRequest(f"stream_format must be 'audio' or 'sse', not {body.stream_format!r}")
    if body.response_format not in ("pcm", "wav"):
        raise UnsupportedFormat(f"response_format {body.response_format!r} is not supported; use 'pcm' or 'wav'")
    plan = state.plan(
        text=body.input,
        voice=body.voice_id,
        fmt=body.response_format,
        sample_rate=OPENAI_RATE,
        speed=body.speed,
        instructions=body.instructions,
        request_id=request_id_of(request),
    )
    return await open_stream(state, request, plan, endpoint="audio_speech", sse=body.stream_format == "sse")


@router.get("/v1/voices")
async def voices(request: Request) -> JSONResponse:
    state = state_of(request)
    engine = state.require_engine()
    listed = [
        {"id": v.id, "engine": v.engine, "languages": list(v.languages), "description": v.description}
        for v in engine.voices()
    ]
    return JSONResponse({"voices": listed, "default": state.default_voice(), "aliases": state.settings.voice_aliases})


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    state = state_of(request)
    if state.startup_error:
        return JSONResponse({"status": "failed", "error": state.startup_error}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    engine = state.require_engine()
    return JSONResponse(
        {"status": "ok", "engine": engine.name, "sample_rate": engine.sample_rate, "active_streams": state.limiter.active}
    )


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/debug/timings")
async def timings(request: Request, last: int = 100) -> JSONResponse:
    """Server-side timings of the most recent streams (what `voxgate bench http` reads)."""
    kept = list(state_of(request).timings)
    return JSONResponse({"timings": kept[-max(0, last) :] if last else []})


# ---------------------------------------------------------------------- streaming


async def open_stream(state: ServerState, request: Request, plan: StreamPlan, endpoint: str, sse: bool) -> Response:
    """Admit the stream, start the engine, and wrap it in a streaming response.

    The first engine chunk is awaited before the status line is sent, so a failure at the
    start is a typed JSON error; once audio has started, a failure drops the connection.
    """
    engine = state.require_engine()
    client = request.scope["state"]["client_id"]
    timing = Timing(t_req_in=request.scope["state"]["t_req_in"])
    state.limiter.acquire(client)
    state.metrics.active_streams.set(state.limiter.active)
    req = plan.request
    hit = state.starters.match(req.voice, req.text) if state.settings.starter_cache and req.speed == 1.0 else None
    stream: EngineStream | None = None
    try:
        if hit is None or hit.remainder:
            state.metrics.engine_streams.inc()
            engine_req = replace(req, text=hit.remainder) if hit else req
            # on a starter hit the engine starts once the cached opener is on the wire
            stream = EngineStream(engine, engine_req, state.executor, state.metrics.engine_streams.dec, start=hit is None)
        first = await stream.next() if stream is not None and hit is None else None
    except BaseException:
        if stream is not None:
            stream.cancel("failed")
        state.limiter.release(client)
        state.metrics.active_streams.set(state.limiter.active)
        raise

    def on_finish(outcome: StreamOutcome) -> None:
        if stream is not None:
            stream.cancel(outcome.status)
            outcome.timing.chunks_generated = stream.generated
        state.limiter.release(client)
        state.record(endpoint, req.request_id, outcome.timing, outcome.status, hit is not None)

    encoder = StreamEncoder(plan.fmt, engine.sample_rate, plan.sample_rate)
    chunk_ms = state.settings.chunk_ms
    piece = encoder.bytes_per_sample * plan.sample_rate * chunk_ms // 1000
    pieces = _audio_pieces(encoder, piece, timing, hit, first, stream)
    headers = {
        "x-sample-rate": str(plan.sample_rate),
        "x-chunk-ms": str(chunk_ms),
        "x-request-id": req.request_id,
        "x-cache-starter": "true" if hit else "false",
        "x-audio-format": plan.fmt,
        "cache-control": "no-store",
    }
    if sse:
        events = _sse_events(pieces, req.text, timing)
        return AudioStreamResponse(events, timing, on_finish, headers, "text/event-stream")
    return AudioStreamResponse(pieces, timing, on_finish, headers, encoder.media_type)


async def _audio_pieces(
    encoder: StreamEncoder,
    piece: int,
    timing: Timing,
    hit: StarterHit | None,
    first: AudioChunk | None,
    stream: EngineStream | None,
) -> AsyncIterator[bytes]:
    """Encoded wire pieces: the cached opener (if any), then the engine's chunks."""
    if hit is not None:
        for part in split_bytes(encoder.encode(hit.samples), piece):
            yield part
            if stream is not None:
                stream.start()
        timing.audio_s = encoder.samples_out / encoder.out_rate
    chunk = first if first is not None or stream is None else await stream.next()
    while chunk is not None:
        for part in split_bytes(encoder.encode(chunk.samples), piece):
            yield part
        timing.audio_s = encoder.samples_out / encoder.out_rate
        chunk = await stream.next() if stream is not None else None
    tail = encoder.flush()
    timing.audio_s = encoder.samples_out / encoder.out_rate
    if tail:
        yield tail


async def _sse_events(pieces: AsyncIterator[bytes], text: str, timing: Timing) -> AsyncIterator[bytes]:
    """OpenAI's SSE stream: `speech.audio.delta` events, then `speech.audio.done`.

    Usage counts text units in and 80 ms audio frames out (voxgate has no billing tokens).
    """
    try:
        async for part in pieces:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(part).decode()}
            yield f"data: {json.dumps(event)}\n\n".encode()
    except VoxgateError as exc:
        timing.error_code = exc.code
        yield f"data: {json.dumps({'type': 'error', **error_of(exc)})}\n\n".encode()
        return
    finally:
        await pieces.aclose()  # type: ignore[attr-defined]
    tokens_in, tokens_out = count_units(text), round(timing.audio_s / 0.08)
    usage = {"input_tokens": tokens_in, "output_tokens": tokens_out, "total_tokens": tokens_in + tokens_out}
    yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()
