"""Typed wire messages of the HTTP API and the error body every endpoint returns."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from voxgate.audio import COMPRESSED, FORMATS, SAMPLE_RATES
from voxgate.text import check_characters
from voxgate.types import InvalidRequest, VoxgateError

M = TypeVar("M", bound=BaseModel)

# What `voxgate.text.check_text` accepts, for the OpenAPI description only (validation stays
# in check_text, so its typed codes stay: `empty_text`, `text_too_long`, `invalid_request`):
# not blank, no control characters but tab and newlines. `x-spoken-text` marks the field for
# `voxgate.serving.openapi`, which sets `maxLength` to the server's VOXGATE_MAX_TEXT_CHARS.
_CONTROL = r"\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F-\u009F"
SPOKEN_TEXT: dict[str, Any] = {
    "minLength": 1,
    "pattern": rf"^[^{_CONTROL}]*[^\s{_CONTROL}][^{_CONTROL}]*$",
    "x-spoken-text": True,
}
_SPOKEN = "not blank; no control characters but tab and newlines, no lone surrogates; at most VOXGATE_MAX_TEXT_CHARS"


def _clean(text: str) -> str:
    try:
        check_characters(text)
    except VoxgateError as exc:
        raise ValueError(exc.message) from None  # a validation error naming the field
    return text


# A message field's text with no control characters (tab and newlines aside) and no lone
# surrogates, checked where the message is parsed, as every text voxgate takes.
CleanText = Annotated[str, AfterValidator(_clean)]

# OpenAI's speech models `/v1/audio/speech` takes by name (each also with a dated snapshot
# suffix, e.g. gpt-4o-mini-tts-2025-03-20); all are spoken by the server's engine.
OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-tts")


class TTSStreamBody(BaseModel):
    """`POST /tts/stream`. Unknown fields are rejected so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str = Field(description=_SPOKEN, json_schema_extra=SPOKEN_TEXT, examples=["Hello there."])
    voice: str | None = None
    language: str | None = None
    format: str = Field(
        "pcm", json_schema_extra={"enum": [*FORMATS, *COMPRESSED]},
        description="mulaw is 8 kHz only; mp3, opus (Ogg), aac (ADTS) and flac are encoded as they stream",
    )  # fmt: skip
    sample_rate: int | None = Field(
        None,
        description=f"the engine's own rate by default (opus: the next rate Opus takes); else one of "
        f"{', '.join(map(str, SAMPLE_RATES))}",
    )
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = Field(None, max_length=2000)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    priority: int = Field(0, ge=-100, le=100, description="higher is scheduled first (batched engines)")


class VoiceUpload(BaseModel):
    """`POST /v1/voices`: clone a voice from a reference recording (Base models)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    audio: str = Field(
        description="base64 of a recording, 0.5-30 s at 8-48 kHz: WAV (8/16/24/32-bit PCM or float), "
        "FLAC, OGG (Vorbis/Opus), MP3, M4A/AAC, WebM or AIFF",
        json_schema_extra={"format": "byte"},
    )
    text: str | None = Field(
        None, max_length=2000, description=f"transcript; enables in-context cloning; {_SPOKEN}",
        json_schema_extra=SPOKEN_TEXT,
    )  # fmt: skip


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str


class SpeechBody(BaseModel):
    """`POST /v1/audio/speech`, OpenAI-compatible. Extra fields are ignored, as new SDK
    versions may add some."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(description=f"{', '.join(OPENAI_MODELS)} (or a dated snapshot), voxgate or the engine's name",
                       examples=["tts-1"])  # fmt: skip
    input: str = Field(description=_SPOKEN, json_schema_extra=SPOKEN_TEXT, examples=["Hello there."])
    voice: str | VoiceRef = Field(description="a voice id, or one of VOXGATE_VOICE_ALIASES", examples=["alloy"])
    response_format: str = Field("mp3", json_schema_extra={"enum": ["mp3", "opus", "aac", "flac", "wav", "pcm"]})
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream_format: str = Field("audio", json_schema_extra={"enum": ["audio", "sse"]})

    @property
    def voice_id(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id


# ------------------------------------------------------------------ responses (documentation)
# The routes build their JSON themselves; these models describe it in /openapi.json.


class ErrorDetail(BaseModel):
    message: str = Field(description="for people: what is wrong and, where it helps, what is accepted")
    type: str = Field(
        description="OpenAI's class of the error: invalid_request_error, authentication_error, permission_error, "
        "not_found_error, rate_limit_error or server_error"
    )
    param: str | None = Field(description="the request field at fault, when one is")
    code: str = Field(description="stable and machine-readable (README: Error codes)")


class ErrorBody(BaseModel):
    """Every error voxgate answers, on every endpoint."""

    error: ErrorDetail


class VoiceOut(BaseModel):
    id: str
    engine: str
    languages: list[str]
    description: str


class VoiceList(BaseModel):
    voices: list[VoiceOut]
    default: str | None = Field(description="the voice used when a request names none")
    aliases: list[str] = Field(description="names accepted for the server's voices (OpenAI's voice names)")
    alias_voices: dict[str, str] = Field(
        description="the voice each alias speaks with (VOXGATE_VOICE_MAP, else in turn)"
    )


class Healthy(BaseModel):
    status: Literal["ok"]
    engine: str
    sample_rate: int
    active_streams: int
    stream_slots: int


class NotHealthy(BaseModel):
    status: Literal["starting", "failed"]
    error: str | None = Field(None, description="why start-up failed (status `failed` only)")


class Timings(BaseModel):
    timings: list[dict[str, Any]] = Field(
        description="per stream: request_id, endpoint, status, and the server-side times "
        "(t_req_in, ttfa_ms, total_ms, audio_s, rtf, chunks); a WebSocket segment's first audio: status "
        "first_audio, t_wall, ttfa_ms and stages_ms (queue, slot, engine, hop, write), at_ms (each reading on the "
        "process's clock, ms: ready, taken, slot, chunk, hop, written) and, from the batched qwen3 engine, "
        "engine_ms (open, wait, gpu, pickup), its readings in at_ms (submitted, prefill, first_step, first_frame) "
        "and batch (admitted_with, first_step_rows: the streams prefilled and stepped with it)"
    )
    capacity: int = Field(description="how many records the server keeps (VOXGATE_TIMINGS_KEPT); older ones are gone")


_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                429: "rate_limit_error"}  # fmt: skip


def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status: what its SDKs and their users branch on."""
    if status >= 500:
        return "server_error"
    return _ERROR_TYPES.get(status, "invalid_request_error")


def error_body(code: str, message: str, status: int = 400, param: str | None = None) -> dict[str, Any]:
    """OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: `code` is voxgate's
    stable code, `type` OpenAI's class of it, `param` the request field at fault (or null)."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_of(exc: VoxgateError) -> dict[str, Any]:
    return error_body(exc.code, exc.message, exc.status, getattr(exc, "param", None))


def parse_body(model: type[M], raw: bytes) -> M:
    """Validate a JSON body whatever its content-type (curl -d sends a form type)."""
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        error = InvalidRequest(describe_validation(exc.errors()))
        error.param = _param(exc.errors())
        raise error from None


@contextmanager
def fields_at_fault(fields: Mapping[str, str]) -> Iterator[None]:
    """Refusals raised inside name the request field they are about (OpenAI's `param`), where
    they do not already: `fields` maps an error code to that field of this endpoint's body. The
    checks are shared by every endpoint (`ServerState.plan`); the fields' names are not."""
    try:
        yield
    except VoxgateError as exc:
        if exc.param is None:
            exc.param = fields.get(exc.code)
        raise


def _param(errors: list[Any]) -> str | None:
    """The first field a validation error names (OpenAI's `param`)."""
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if loc:
            return ".".join(loc)
    return None


def describe_validation(errors: list[Any]) -> str:
    """Pydantic errors as one readable line: `field: problem; field: problem`."""
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid":  # where and why (a lone surrogate escape, a cut-off body)
            why = str(err.get("ctx", {}).get("error", ""))[:200]
            return "the body is not valid JSON" + (f": {why}" if why else "")
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"
