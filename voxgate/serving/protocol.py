"""Typed wire messages of the HTTP API and the error body every endpoint returns."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voxgate.types import InvalidRequest, VoxgateError

M = TypeVar("M", bound=BaseModel)


class TTSStreamBody(BaseModel):
    """`POST /tts/stream`. Unknown fields are rejected so typos do not pass silently."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    voice: str | None = None
    language: str | None = None
    format: str = "pcm"
    sample_rate: int | None = None
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
        "FLAC, OGG (Vorbis/Opus), MP3, M4A/AAC, WebM or AIFF"
    )
    text: str | None = Field(None, max_length=2000, description="transcript; enables in-context cloning")


class VoiceRef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str


class SpeechBody(BaseModel):
    """`POST /v1/audio/speech`, OpenAI-compatible. Extra fields are ignored, as new SDK
    versions may add some; mp3/opus/aac/flac are refused with `unsupported_format`."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    input: str
    voice: str | VoiceRef
    response_format: str = "wav"  # OpenAI's default is mp3, which voxgate does not encode
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream_format: str = "audio"

    @property
    def voice_id(self) -> str:
        return self.voice if isinstance(self.voice, str) else self.voice.id


def error_body(code: str, message: str) -> dict[str, Any]:
    """`{"error": {"code", "message", "type"}}`; `type` keeps OpenAI SDKs' parsers happy."""
    return {"error": {"code": code, "message": message, "type": code}}


def error_of(exc: VoxgateError) -> dict[str, Any]:
    return error_body(exc.code, exc.message)


def parse_body(model: type[M], raw: bytes) -> M:
    """Validate a JSON body whatever its content-type (curl -d sends a form type)."""
    try:
        return model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        raise InvalidRequest(describe_validation(exc.errors())) from None


def describe_validation(errors: list[Any]) -> str:
    """Pydantic errors as one readable line: `field: problem; field: problem`."""
    parts = []
    for err in errors:
        if err.get("type") == "json_invalid":
            return "the body is not valid JSON"
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"
