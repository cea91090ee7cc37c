"""HTTP routes: /tts/stream, OpenAI-compatible /v1/audio/speech, voices, health, metrics."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from voxgate.audio import StreamEncoder, split_bytes
from voxgate.audio_decode import decode_audio
from voxgate.engines.base import Engine, VoiceCloner
from voxgate.serving.openapi import (
    ADMIN_ERRORS,
    AUDIO_HEADERS,
    BINARY,
    SPEECH_EVENT,
    TEXT,
    errors,
    json_body,
    sse,
    streamed,
)
from voxgate.serving.protocol import (
    Healthy,
    NotHealthy,
    SpeechBody,
    Timings,
    TTSStreamBody,
    VoiceList,
    VoiceOut,
    VoiceUpload,
    error_of,
    parse_body,
)
from voxgate.serving.starter import StarterHit
from voxgate.serving.state import ServerState, StreamPlan
from voxgate.serving.stream import AudioStreamResponse, DisconnectWatch, EngineStream, StreamOutcome
from voxgate.text import check_text, count_units
from voxgate.types import (
    AudioChunk,
    InvalidRequest,
    NotFound,
    NotSupported,
    Timing,
    UnknownModel,
    UnsupportedFormat,
    VoiceInfo,
    VoxgateError,
)

router = APIRouter()
OPENAI_RATE = 24000  # OpenAI's pcm is 24 kHz, 16-bit, mono
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxgate")


def state_of(request: Request) -> ServerState:
    return request.app.state.voxgate  # type: ignore[no-any-return]


def request_id_of(request: Request) -> str:
    return request.scope["state"]["request_id"]  # type: ignore[no-any-return]


def client_of(request: Request) -> str:
    """The client identity `RequestGate` stamped on the request (API key index, else address)."""
    return str(request.scope["state"]["client_id"])


_SPEECH_ERRORS = {
    413: "text_too_long: over VOXGATE_MAX_TEXT_CHARS; request_too_large: the body is over VOXGATE_MAX_REQUEST_BYTES",
    429: "too_many_streams: this client has VOXGATE_MAX_STREAMS_PER_CLIENT streams open",
    503: "busy: the server has VOXGATE_MAX_STREAMS streams open; not_ready: still warming up",
}
_NOT_READY = {503: "not_ready: the engine is still warming up"}
_CLONING = "not_supported: this engine cannot clone voices"


@router.post(
    "/tts/stream",
    response_class=Response,
    openapi_extra=json_body(
        TTSStreamBody,
        pcm={"text": "Hello there."},
        wav={"text": "Hello there.", "format": "wav", "sample_rate": 16000},
        mulaw={"text": "Hello there.", "format": "mulaw"},
    ),
    responses={
        200: streamed(
            "chunked audio: pcm (s16le mono), wav (a header of unknown length, then s16le) or mulaw (8 kHz)",
            {"audio/pcm": BINARY, "audio/wav": BINARY, "audio/basic": BINARY},
            AUDIO_HEADERS,
        ),
        **errors({400: "invalid_request, empty_text, unknown_voice, unsupported_format, unsupported_sample_rate, "
                       "unsupported_language", **_SPEECH_ERRORS}),
    },
)  # fmt: skip
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
        instructions=body.instructions,
        seed=body.seed,
        priority=body.priority,
        request_id=request_id_of(request),
        client=client_of(request),
    )
    return await open_stream(state, request, plan, endpoint="/tts/stream", sse=False)


@router.post(
    "/v1/audio/speech",
    response_class=Response,
    openapi_extra=json_body(
        SpeechBody,
        wav={"model": "tts-1", "input": "Hello there.", "voice": "alloy"},
        pcm={"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "pcm"},
        sse={"model": "tts-1", "input": "Hello there.", "voice": "alloy", "stream_format": "sse"},
    ),
    responses={
        200: streamed(
            "chunked audio (pcm: 24 kHz s16le mono; wav), or with stream_format sse the events "
            "speech.audio.delta {audio: base64} and speech.audio.done {usage}",
            {"audio/pcm": BINARY, "audio/wav": BINARY, "text/event-stream": sse(SPEECH_EVENT)},
            AUDIO_HEADERS,
        ),
        **errors({400: "invalid_request, empty_text, unknown_model, unknown_voice, unsupported_format, "
                       "unsupported_language", **_SPEECH_ERRORS}),
    },
)  # fmt: skip
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
        client=client_of(request),
    )
    return await open_stream(state, request, plan, endpoint="/v1/audio/speech", sse=body.stream_format == "sse")


@router.get("/v1/voices", responses={200: {"model": VoiceList}, **errors(_NOT_READY)})
async def voices(request: Request) -> JSONResponse:
    """The voices this client may use: the server's and its own cloned ones."""
    state, client = state_of(request), client_of(request)
    engine = state.require_engine()
    listed = [_voice_json(v) for v in engine.voices() if state.voice_owners.may_use(v.id, client)]
    default = state.default_voice(client)
    return JSONResponse({"voices": listed, "default": default, "aliases": state.settings.voice_aliases})


@router.post(
    "/v1/voices",
    status_code=201,
    openapi_extra=json_body(VoiceUpload),
    responses={
        201: {"model": VoiceOut, "description": "the cloned voice"},
        **errors({
            400: f"invalid_request, empty_text, invalid_audio; {_CLONING}",
            409: "voice_exists: the id is another client's, or one of the engine's own",
            413: "text_too_long: the transcript is over VOXGATE_MAX_TEXT_CHARS; "
                 "request_too_large: the body is over VOXGATE_MAX_VOICE_UPLOAD_BYTES",
            429: "too_many_voices: this client keeps VOXGATE_MAX_VOICES_PER_CLIENT voices",
            **_NOT_READY,
        }),
    },
)  # fmt: skip
async def add_voice(request: Request) -> JSONResponse:
    """Clone a voice from reference audio (and its transcript for in-context cloning).

    The id is claimed for this client before the audio is decoded (409 if another client
    has it, 429 past the per-client cap); decoding and cloning run on a worker, which
    settles the claim however they end, even if this request is abandoned meanwhile.
    """
    state, client = state_of(request), client_of(request)
    engine = state.require_engine()
    body = parse_body(VoiceUpload, await request.body())
    if not isinstance(engine, VoiceCloner):
        raise NotSupported(f"the {engine.name} engine cannot clone voices")
    if body.text is not None:
        check_text(body.text, state.settings.max_text_chars)
    try:
        audio = base64.b64decode(body.audio, validate=True)
    except ValueError:
        raise InvalidRequest("audio must be base64") from None
    state.voice_owners.begin(body.id, client, engine_has_it=_engine_has(engine, body.id))
    loop = asyncio.get_running_loop()
    info = await loop.run_in_executor(state.executor, _register_voice, state, engine, body, audio)
    return JSONResponse(_voice_json(info), status_code=201)


def _register_voice(state: ServerState, engine: Engine, body: VoiceUpload, audio: bytes) -> VoiceInfo:
    """On a worker: decode (bounded, see voxgate/audio_decode.py), clone, settle the claim."""
    try:
        decoded = decode_audio(audio)
        return engine.add_voice(body.id, decoded.samples, decoded.sample_rate, body.text)  # type: ignore[attr-defined]
    finally:
        state.voice_owners.end(body.id, engine_has_it=_engine_has(engine, body.id))


def _engine_has(engine: Engine, voice_id: str) -> bool:
    return any(v.id == voice_id for v in engine.voices())


@router.delete(
    "/v1/voices/{voice_id}",
    status_code=204,
    responses=errors({400: _CLONING, 404: "not_found: no such voice of this client's", **_NOT_READY}),
)
async def remove_voice(voice_id: str, request: Request) -> Response:
    """Forget one of this client's cloned voices; another client's is `not_found`, as an
    unknown one, so that its existence is not revealed."""
    state = state_of(request)
    engine = state.require_engine()
    if not isinstance(engine, VoiceCloner):
        raise NotSupported(f"the {engine.name} engine cannot clone voices")
    if not state.voice_owners.owns(voice_id, client_of(request)):
        raise NotFound(f"no cloned voice {voice_id!r}")
    engine.remove_voice(voice_id)
    state.voice_owners.forget(voice_id)
    return Response(status_code=204)


def _voice_json(v: VoiceInfo) -> dict[str, Any]:
    return {"id": v.id, "engine": v.engine, "languages": list(v.languages), "description": v.description}


@router.get(
    "/healthz",
    responses={
        200: {"model": Healthy, "description": "ready"},
        503: {"model": NotHealthy, "description": "starting (loading, warming up), or failed to start"},
    },
)
async def healthz(request: Request) -> JSONResponse:
    state = state_of(request)
    if state.startup_error:
        return JSONResponse({"status": "failed", "error": state.startup_error}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    engine = state.require_engine()
    return JSONResponse(
        {
            "status": "ok",
            "engine": engine.name,
            "sample_rate": engine.sample_rate,
            "active_streams": state.limiter.active,
        }
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": TEXT}}}},
)
async def metrics(request: Request) -> Response:
    return Response(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/debug/timings", responses={200: {"model": Timings}, **errors(ADMIN_ERRORS)})
async def timings(request: Request, last: int = Query(100, ge=0, le=100_000)) -> JSONResponse:
    """Server-side timings of the most recent streams (what `voxgate bench http` reads)."""
    kept = list(state_of(request).timings)
    return JSONResponse({"timings": kept[len(kept) - last :] if last else []})


# ---------------------------------------------------------------------- streaming


async def open_stream(state: ServerState, request: Request, plan: StreamPlan, endpoint: str, sse: bool) -> Response:
    """Admit the stream, start the engine, and wrap it in a streaming response.

    The first engine chunk is awaited before the status line is sent, so a failure at the
    start is a typed JSON error (on a starter-cache hit the cached audio goes first, so a
    later engine failure is a mid-stream one). The stream's slot is released, and its
    timing recorded, once both the response and the engine iterator have finished.
    """
    engine = state.require_engine()
    scope = request.scope["state"]
    client, req = scope["client_id"], plan.request
    state.limiter.acquire(client)
    state.metrics.active_streams.set(state.limiter.active)
    outcome = StreamOutcome(Timing(t_req_in=scope["t_req_in"]))
    cacheable = state.settings.starter_cache and req.speed == 1.0 and req.seed is None and not req.instructions
    hit = state.starters.match(req.voice, req.text) if cacheable else None
    needs_engine = hit is None or bool(hit.remainder)
    stream: EngineStream | None = None

    def finish() -> None:
        state.limiter.release(client)
        if stream is not None:
            outcome.timing.chunks_generated = stream.generated
        if hit is not None:
            state.metrics.starter_hits.inc()
        state.record(endpoint, req.request_id, outcome.timing, outcome.status, hit is not None)

    # The slot is freed once the response is over and the engine has stopped working: at
    # once for a stream that ran to its end, after the chunk in flight for a cancelled one.
    end = _StreamEnd(finish, engine_done=not needs_engine)
    if needs_engine:
        loop = asyncio.get_running_loop()
        state.metrics.engine_streams.inc()

        def closed_in_worker() -> None:
            state.metrics.engine_streams.dec()
            loop.call_soon_threadsafe(end.engine_stopped)

        stream = EngineStream(
            engine,
            replace(req, text=hit.remainder) if hit else req,
            state.engine_pool,
            on_closed=closed_in_worker,
            start=hit is None,  # on a hit the engine starts once the cached opener is on the wire
        )
    watch = DisconnectWatch(request.receive)
    if stream is not None:
        watch.on_gone(lambda: stream.cancel("client_disconnect"))

    def on_finish(done: StreamOutcome) -> None:
        if stream is not None:
            if stream.exhausted:
                end.engine_stopped()
            stream.cancel(done.status)
        end.response_over()

    try:
        first = await stream.next() if stream is not None and hit is None else None
    except VoxgateError as exc:
        outcome.status, outcome.timing.error_code = "failed", exc.code
        outcome.timing.t_done = time.perf_counter()
        watch.stop()
        on_finish(outcome)
        raise
    if watch.gone.is_set():
        outcome.status = "client_disconnect"

    encoder = StreamEncoder(plan.fmt, engine.sample_rate, plan.sample_rate)
    chunk_ms = state.settings.chunk_ms
    piece = encoder.bytes_per_sample * (plan.sample_rate * chunk_ms // 1000)
    body = _audio_pieces(encoder, piece, outcome.timing, hit, first, stream)
    headers = {
        "x-sample-rate": str(plan.sample_rate),
        "x-chunk-ms": str(chunk_ms),
        "x-request-id": req.request_id,
        "x-cache-starter": "true" if hit else "false",
        "x-audio-format": plan.fmt,
        "cache-control": "no-store",
    }
    media_type = encoder.media_type
    if sse:
        body, media_type = _sse_events(body, req.text, outcome.timing), "text/event-stream"
    timeout = state.settings.send_timeout_s
    return AudioStreamResponse(body, outcome, watch, on_finish, headers, media_type, timeout)


class _StreamEnd:
    """Runs `action` once, when both the response and the engine are done."""

    __slots__ = ("action", "engine_done", "fired", "response_done")

    def __init__(self, action: Callable[[], None], engine_done: bool) -> None:
        self.action, self.response_done, self.engine_done, self.fired = action, False, engine_done, False

    def response_over(self) -> None:
        self.response_done = True
        self._maybe_fire()

    def engine_stopped(self) -> None:
        self.engine_done = True
        self._maybe_fire()

    def _maybe_fire(self) -> None:
        if self.response_done and self.engine_done and not self.fired:
            self.fired = True
            self.action()


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
