"""Typed messages of the WebSocket TTS protocol (docs/protocol.md) and their parsing.

`parse_client` turns one text frame into a client message or raises `ProtocolError` with the
protocol's error code; the server's messages are built as plain dicts by the helpers below.
`schema()` is the JSON schema of every client message (`voxgate protocol-schema`).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from voxgate.serving.protocol import describe_validation


class ProtocolError(Exception):
    """A refused message: `code` and `fatal` go on the wire in an `error` message."""

    def __init__(self, code: str, message: str, fatal: bool = False, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.fatal, self.extra = code, message, fatal, extra

    def to_message(self) -> dict[str, Any]:
        return error(self.code, self.message, self.fatal, **self.extra)


SESSION_ID_MAX = 64
_SESSION_ID = re.compile(rf"[A-Za-z0-9._~-]{{1,{SESSION_ID_MAX}}}")  # URL-safe: a query parameter as it is


def check_session_id(value: str, fatal: bool = False) -> str:
    """A client-chosen session id as given, or `invalid_session_id` (`fatal` for a connect's
    key: it cannot change on that socket)."""
    if not _SESSION_ID.fullmatch(value):
        raise ProtocolError("invalid_session_id", f"a session id is 1-{SESSION_ID_MAX} characters of "
                            "A-Z a-z 0-9 . _ ~ -", fatal=fatal)  # fmt: skip
    return value


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Resume(_Message):
    session_id: str = Field(max_length=64)
    resume_token: str = Field(max_length=128, description="from session.started: proves the session is yours")
    last_unit_index_received: int = Field(ge=-1)


class SessionStart(_Message):
    type: Literal["session.start"]
    voice: str | None = Field(None, max_length=128)
    language: str | None = Field(None, max_length=32)
    format: str = Field("pcm16", max_length=16, description="pcm16, mulaw, mp3, opus (Ogg), aac (ADTS)")
    sample_rate: int | None = Field(None, ge=8000, le=48000)
    binary: bool = True
    units: Literal["words", "chars"] = "words"
    max_pending_units: int = Field(12, ge=1, le=200)
    starter_units: int = Field(
        3, ge=0, le=200, description="an utterance's first segment: at most this many units (0: no starter)"
    )
    segments: Literal["auto", "utterance"] = Field(
        "auto", description="auto: segments as text arrives; utterance: one per utterance, at text.end (or flush)"
    )
    pacing: bool = False
    pacing_lead_ms: int = Field(300, ge=0, le=5000)
    speed: float = Field(1.0, ge=0.25, le=4.0, description="speaking rate (qwen3: time-stretched, pitch kept)")
    instructions: str | None = Field(None, max_length=2000, description="style instructions (qwen3 VoiceDesign)")
    session_id: str | None = Field(
        None,
        max_length=SESSION_ID_MAX,
        description="the new session's id, chosen by the client (1-64 of A-Z a-z 0-9 . _ ~ -; unique on the "
        "server): the key a load balancer or Ray Serve routes the session and its resumes by. Omitted: the "
        "connect's ?session= or X-Voxgate-Session, else a random id",
    )
    resume: Resume | None = None


class TextDelta(_Message):
    type: Literal["text.delta"]
    text: str = Field(min_length=1, max_length=4000)
    first_unit_index: int | None = Field(None, ge=0, description="omitted: the server numbers the units")


class Bare(_Message):
    """Messages with no fields."""

    type: Literal["text.flush", "text.end", "cancel", "session.end"]


class Ping(_Message):
    type: Literal["ping"]
    id: Annotated[str, Field(max_length=256)] | int | None = None


ClientMessage = Annotated[SessionStart | TextDelta | Bare | Ping, Field(discriminator="type")]
_ADAPTER: TypeAdapter[SessionStart | TextDelta | Bare | Ping] = TypeAdapter(ClientMessage)
CLIENT_TYPES = ("session.start", "text.delta", "text.flush", "text.end", "cancel", "session.end", "ping")

# vLLM-Omni's streaming speech socket: its names for the same messages (its session.config: omni.py).
_COMPAT = {"input.text": "text.delta", "input.done": "text.end", "session.close": "session.end"}


def decode_frame(raw: str | bytes | None, max_bytes: int) -> Any:
    """A client frame's JSON (any WebSocket protocol of ours): text only, at most `max_bytes`."""
    if not isinstance(raw, str):
        raise ProtocolError("binary_not_supported", "send JSON text frames; binary frames are not accepted")
    if len(raw) > max_bytes or len(raw.encode()) > max_bytes:  # characters first: a cheap bound
        raise ProtocolError("message_too_large", f"messages are limited to {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ProtocolError("invalid_message", "the message is not valid JSON") from None
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(data):
        raise ProtocolError("invalid_message", "the message has an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)")
    return data


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins a valid pair into one character


def _has_lone_surrogate(data: Any) -> bool:
    """True if a string anywhere in `data` (a key or a value) holds an unpaired surrogate (JSON
    allows the escape; UTF-8 cannot carry it, so echoing it back would break the socket's
    writer). Walked with a stack, not recursion: a frame may nest as deep as `json.loads`
    allows, and re-encoding it recursively from a deeper frame raised RecursionError."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_client(raw: str | bytes, max_bytes: int, compat: bool = False) -> SessionStart | TextDelta | Bare | Ping:
    """One client frame -> a typed message; `ProtocolError` for anything else."""
    return parse_data(decode_frame(raw, max_bytes), compat)


def parse_data(data: Any, compat: bool = False) -> SessionStart | TextDelta | Bare | Ping:
    """A decoded frame -> a typed message; with `compat`, vLLM-Omni's names for ours too
    (its `session.config`: `serving/omni.py`)."""
    kind = message_type(data, (*CLIENT_TYPES, *_COMPAT) if compat else CLIENT_TYPES)
    if kind in _COMPAT:
        data = {"type": _COMPAT[kind], **({"text": data.get("text")} if kind == "input.text" else {})}
        kind = data["type"]
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_message", f"{kind}: {describe_validation(exc.errors())}") from None


def message_type(data: Any, known: tuple[str, ...]) -> str:
    """A decoded frame's `type`, one of `known` (every socket protocol of ours): a frame that is
    not an object, or has no `type` string, is `invalid_message`; a type not known, `unknown_type`."""
    if not isinstance(data, dict):
        raise ProtocolError("invalid_message", "a message is a JSON object with a 'type'")
    kind = data.get("type")
    if not isinstance(kind, str):
        problem = "has a 'type' that is not a string" if "type" in data else "has no 'type'"
        raise ProtocolError("invalid_message", f"the message {problem}; known types: {', '.join(known)}")
    if kind not in known:
        raise ProtocolError("unknown_type", f"unknown message type {kind!r}; known: {', '.join(known)}")
    return kind


def schema() -> dict[str, Any]:
    return _ADAPTER.json_schema()


# ------------------------------------------------------------------ server messages


def error(code: str, message: str, fatal: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "fatal": fatal, **extra}
