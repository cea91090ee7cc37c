"""HTTP routes: /tts/stream, OpenAI-compatible /v1/audio/speech, voices, health, metrics."""

from __future__ import annotations

import asyncio
import base64
import re
import time
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from voxgate.audio import COMPRESSED, FORMATS, resample
from voxgate.audio_decode import decode_audio
from voxgate.audio_encode import MEDIA_TYPES
from voxgate.engines.base import Engine, VoiceCloner
from voxgate.serving.http_stream import open_stream
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
    OPENAI_MODELS,
    Healthy,
    NotHealthy,
    SpeechBody,
    Timings,
    TTSStreamBody,
    VoiceList,
    VoiceOut,
    VoiceUpload,
    fields_at_fault,
    parse_body,
)
from voxgate.serving.state import ServerState
from voxgate.text import check_text
from voxgate.types import (
    InvalidRequest,
    NotFound,
    NotSupported,
    TextTooLong,
    UnknownModel,
    UnsupportedFormat,
    VoiceInfo,
)

router = APIRouter()
OPENAI_RATE = 24000  # OpenAI's pcm is 24 kHz, 16-bit, mono
_OPENAI_MODEL = re.compile(f"({'|'.join(map(re.escape, OPENAI_MODELS))})(-\\d{{4}}-\\d{{2}}-\\d{{2}})?")  # or dated
HTTP_FORMATS = (*FORMATS, *COMPRESSED)  # streamed: compressed audio is encoded as it is made
SPEECH_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")  # OpenAI's, mp3 its default
COMPRESSED_MEDIA = {MEDIA_TYPES[f]: BINARY for f in COMPRESSED}


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
            "chunked audio: pcm (s16le mono), wav (a header of unknown length, then s16le), mulaw (8 kHz), "
            "or encoded as it streams: mp3, opus (Ogg), aac (ADTS), flac",
            {"audio/pcm": BINARY, "audio/wav": BINARY, "audio/basic": BINARY, **COMPRESSED_MEDIA},
            AUDIO_HEADERS,
        ),
        **errors({400: "invalid_request, empty_text, unknown_voice, unsupported_format, unsupported_sample_rate, "
                       "unsupported_language", **_SPEECH_ERRORS}),
    },
)  # fmt: skip
async def tts_stream(request: Request) -> Response:
    """Stream speech for `text` as chunked audio (pcm16, wav, 8 kHz mu-law, mp3, opus, aac, flac)."""
    state = state_of(request)
    body = parse_body(TTSStreamBody, await request.body())
    await _voice_current(state, body.voice)
    with fields_at_fault(_STREAM_FIELDS):
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
            formats=HTTP_FORMATS,
        )
    return await open_stream(state, request, plan, endpoint="/tts/stream", sse=False)


@router.post(
    "/v1/audio/speech",
    response_class=Response,
    openapi_extra=json_body(
        SpeechBody,
        mp3={"model": "tts-1", "input": "Hello there.", "voice": "alloy"},
        pcm={"model": "tts-1", "input": "Hello there.", "voice": "alloy", "response_format": "pcm"},
        sse={"model": "tts-1", "input": "Hello there.", "voice": "alloy", "stream_format": "sse"},
    ),
    responses={
        200: streamed(
            "chunked audio at 24 kHz, encoded as it streams (mp3 by default, opus in Ogg, aac in ADTS, "
            "flac, wav, pcm: s16le mono), or with stream_format sse the events "
            "speech.audio.delta {audio: base64} and speech.audio.done {usage}",
            {"audio/pcm": BINARY, "audio/wav": BINARY, **COMPRESSED_MEDIA, "text/event-stream": sse(SPEECH_EVENT)},
            AUDIO_HEADERS,
        ),
        **errors({**_SPEECH_ERRORS,
                  400: "invalid_request, empty_text, text_too_long (400 here, as OpenAI's), unknown_model, "
                       "unknown_voice, unsupported_format, unsupported_language",
                  413: "request_too_large: the body is over VOXGATE_MAX_REQUEST_BYTES"}),
    },
)  # fmt: skip
async def audio_speech(request: Request) -> Response:
    """OpenAI-compatible speech: chunked audio, or SSE with `stream_format: "sse"`."""
    state = state_of(request)
    body = parse_body(SpeechBody, await request.body())
    engine = state.require_engine()
    if body.model not in ("voxgate", engine.name) and not _OPENAI_MODEL.fullmatch(body.model):
        names = ", ".join((*OPENAI_MODELS, "voxgate", engine.name))
        error = UnknownModel(f"unknown model {body.model!r}; use one of {names} (or a dated OpenAI TTS snapshot)")
        error.param = "model"
        raise error
    if body.stream_format not in ("audio", "sse"):
        raise InvalidRequest(f"stream_format must be 'audio' or 'sse', not {body.stream_format!r}")
    await _voice_current(state, body.voice_id)
    if body.response_format not in SPEECH_FORMATS:
        formats = ", ".join(SPEECH_FORMATS)
        error = UnsupportedFormat(f"response_format {body.response_format!r} is not supported; use one of {formats}")
        error.param = "response_format"
        raise error
    try:
        with fields_at_fault(_SPEECH_FIELDS):
            plan = state.plan(
                text=body.input,
                voice=body.voice_id,
                fmt=body.response_format,
                sample_rate=OPENAI_RATE,
                speed=body.speed,
                instructions=body.instructions,
                request_id=request_id_of(request),
                client=client_of(request),
                formats=SPEECH_FORMATS,
            )
    except TextTooLong as exc:  # OpenAI answers an over-long `input` with 400, not 413
        exc.status = 400
        raise
    return await open_stream(state, request, plan, endpoint="/v1/audio/speech", sse=body.stream_format == "sse")


# The request field each refusal of `ServerState.plan` is about, per endpoint (OpenAI's `param`).
_STREAM_FIELDS = {
    "empty_text": "text",
    "text_too_long": "text",
    "unknown_voice": "voice",
    "unsupported_language": "language",
    "unsupported_format": "format",
    "unsupported_sample_rate": "sample_rate",
}
_SPEECH_FIELDS = {"empty_text": "input", "text_too_long": "input", "unknown_voice": "voice",
                  "unsupported_format": "response_format"}  # fmt: skip


@router.get("/v1/voices", responses={200: {"model": VoiceList}, **errors(_NOT_READY)})
async def voices(request: Request) -> JSONResponse:
    """The voices this client may use: the server's and its own cloned ones."""
    state, client = state_of(request), client_of(request)
    engine = state.require_engine()
    await _voices_current(state, engine)
    listed = [_voice_json(v) for v in engine.voices() if state.voice_owners.may_use(v.id, client)]
    default = state.default_voice(client)
    aliases = state.alias_voices()
    return JSONResponse(
        {"voices": listed, "default": default, "aliases": state.settings.voice_aliases, "alias_voices": aliases}
    )


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
            507: "storage_failed: the voice could not be written to VOXGATE_DATA_DIR (it is not kept)",
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
        with fields_at_fault({"empty_text": "text", "text_too_long": "text"}):
            check_text(body.text, state.settings.max_text_chars)
    try:
        audio = base64.b64decode(body.audio, validate=True)
    except ValueError:
        raise InvalidRequest("audio must be base64") from None
    await _voices_current(state, engine)  # owners and caps as every replica has them
    state.voice_owners.begin(body.id, client, engine_has_it=_engine_has(engine, body.id))
    loop = asyncio.get_running_loop()
    info = await loop.run_in_executor(state.executor, _register_voice, state, engine, body, audio)
    return JSONResponse(_voice_json(info), status_code=201)


def _register_voice(state: ServerState, engine: Engine, body: VoiceUpload, audio: bytes) -> VoiceInfo:
    """On a worker: decode (bounded, see voxgate/audio_decode.py), resample to the engine's
    rate, clone and store (serving/voices.py), settle the claim."""
    try:
        decoded = decode_audio(audio)
        samples = resample(decoded.samples, decoded.sample_rate, engine.sample_rate)
        return state.cloned_voices.register(engine, body.id, samples, engine.sample_rate, body.text)  # type: ignore[arg-type]
    finally:
        state.voice_owners.end(body.id, engine_has_it=_engine_has(engine, body.id))


def _engine_has(engine: Engine, voice_id: str) -> bool:
    return any(v.id == voice_id for v in engine.voices())


@router.delete(
    "/v1/voices/{voice_id}",
    status_code=204,
    responses=errors(
        {
            404: "not_found: no such voice of this client's (none on an engine that cannot clone)",
            507: "storage_failed: VOXGATE_DATA_DIR could not be changed",
            **_NOT_READY,
        }
    ),
)
async def remove_voice(voice_id: str, request: Request) -> Response:
    """Forget one of this client's cloned voices; another client's is `not_found`, as an
    unknown one, so that its existence is not revealed (and so is any id on an engine that
    cannot clone: it has no cloned voices)."""
    state = state_of(request)
    engine = state.require_engine()
    if not isinstance(engine, VoiceCloner):
        raise NotFound(f"no cloned voice {voice_id!r}")
    await _voice_current(state, voice_id)
    if not state.voice_owners.owns(voice_id, client_of(request)):
        raise NotFound(f"no cloned voice {voice_id!r}")
    try:
        await asyncio.get_running_loop().run_in_executor(state.executor, state.cloned_voices.remove, engine, voice_id)
    finally:
        if not _engine_has(engine, voice_id):  # else the owner's re-upload got in after this delete
            state.voice_owners.forget(voice_id)
    return Response(status_code=204)


async def _voice_current(state: ServerState, voice_id: str | None) -> None:
    """Another replica on the same VOXGATE_DATA_DIR may have cloned, replaced or deleted
    `voice_id` since this one looked: one stat says so, and then the voice is re-read on a
    worker (registering it takes the engine a while) before the request is answered."""
    if state.cloned_voices.stale(voice_id):
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(state.executor, state.cloned_voices.refresh, state.require_engine(), voice_id)


async def _voices_current(state: ServerState, engine: Engine) -> None:
    """Every stored voice as the data directory has it now (a listing and a stat a voice),
    for answers about all of a client's voices."""
    if state.cloned_voices.store is not None:
        asked_at = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(state.executor, state.cloned_voices.sync, engine, asked_at)


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
            "stream_slots": state.limiter.limit,
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
    ring = state_of(request).timings
    kept = list(ring)
    return JSONResponse({"timings": kept[len(kept) - last :] if last else [], "capacity": ring.maxlen})
