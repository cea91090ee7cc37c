"""Shared vocabulary: requests, audio chunks, timings and typed errors.

Everything that crosses a module boundary is one of these plain dataclasses; no module
here imports asyncio, HTTP or torch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ListenerClock(Protocol):
    """A listener's playback clock (`speech/clock.PlaybackClock`), as an engine reads it."""

    # True while nobody listens (a dropped WebSocket's session waiting for a resume, voicing into
    # its replay buffer): a batched engine serves such a stream last, and may stop it (`Preempted`)
    # to give its place to a stream somebody listens to.
    absent: bool

    def due(self, now: float) -> float:
        """When the listener needs its next audio (`time.perf_counter()`; past while starved)."""
        ...


@dataclass(frozen=True, slots=True)
class SynthesisRequest:
    """What to say and how. Engines receive it already validated by the caller.

    `play_at` is set for audio a listener plays as it arrives (`speech/clock.py`): when the
    first audio is needed; `listener` is that listener's clock, which says how much audio it
    has in hand. A batched engine serves streams by them (earliest first, and a stream whose
    listener has plenty yields to one whose listener does not); None means as fast as possible
    (a whole file, a benchmark)."""

    text: str
    voice: str
    language: str | None = None
    speed: float = 1.0
    instructions: str | None = None
    seed: int | None = None
    priority: int = 0
    request_id: str = ""
    play_at: float | None = None  # `time.perf_counter()` when a real-time listener needs the first audio
    listener: ListenerClock | None = None  # that listener's playback clock, read while the stream runs


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """A piece of mono audio as float32 samples in [-1, 1] at `sample_rate`.

    `unit_start`/`unit_end` give the half-open range of text units (see `voxgate.text`)
    that this chunk covers, when the engine knows it; `t_ready` is the monotonic time
    (`time.perf_counter()`) at which the engine produced it.
    """

    samples: np.ndarray
    sample_rate: int
    seq: int = 0
    unit_start: int | None = None
    unit_end: int | None = None
    t_ready: float = 0.0
    # The same samples as 16-bit PCM, when the engine made them (the batched qwen3 runner: one
    # conversion per step for every stream); encoders that need no resampling send these as
    # they are instead of converting on the event loop. None: the encoder converts.
    pcm16: np.ndarray | None = None
    # On a stream's first chunk, where the engine keeps them: its own perf_counter readings on the
    # way (the batched qwen3 runner: "submitted", "prefill" launched, "first_step" launched,
    # "first_frame" handed out; and two counts, "admitted_with" and "first_step_rows": the streams
    # prefilled and stepped with it), for the server's split of first audio (`/debug/timings`).
    marks: dict[str, float] | None = None

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """A voice an engine offers."""

    id: str
    engine: str
    languages: tuple[str, ...]
    description: str = ""


@dataclass(slots=True)
class Timing:
    """Server-side timestamps of one request (perf_counter seconds), see ARCHITECTURE.md."""

    t_req_in: float
    t_first_audio_out: float | None = None
    t_done: float | None = None
    audio_s: float = 0.0
    chunks_generated: int = 0
    chunks_sent: int = 0
    error_code: str | None = None  # set when the stream ended on an error after it started

    @property
    def ttfa_s(self) -> float | None:
        if self.t_first_audio_out is None:
            return None
        return self.t_first_audio_out - self.t_req_in

    @property
    def total_s(self) -> float | None:
        if self.t_done is None:
            return None
        return self.t_done - self.t_req_in

    @property
    def rtf(self) -> float | None:
        total = self.total_s
        if total is None or self.audio_s <= 0:
            return None
        return total / self.audio_s


class CancelToken:
    """Set once by whoever stops a stream; engines check it between chunks."""

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking at once on cancel; True if cancelled."""
        return self._event.wait(timeout)


# ---------------------------------------------------------------------------- errors


class VoxgateError(Exception):
    """Base of every error voxgate reports: a stable `code`, a human `message`, and the
    HTTP status the serving layer maps it to, and for a refusal that passes (busy, too many
    streams) the seconds after which a retry may succeed (`Retry-After`)."""

    code = "internal_error"
    status = 500
    retry_after_s: int | None = None
    param: str | None = None  # the request field at fault, when known (OpenAI's `param`)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidRequest(VoxgateError):
    """Malformed or inconsistent input."""

    code = "invalid_request"
    status = 400


class EmptyText(VoxgateError):
    """The text is empty, or has nothing to speak (whitespace, punctuation, symbols)."""

    code = "empty_text"
    status = 400


class TextTooLong(VoxgateError):
    """The text exceeds the configured limit."""

    code = "text_too_long"
    status = 413


class RequestTooLarge(VoxgateError):
    """The request body is too large."""

    code = "request_too_large"
    status = 413


class UnknownVoice(VoxgateError):
    """The voice is not offered by the engine."""

    code = "unknown_voice"
    status = 400


class UnknownModel(VoxgateError):
    """The model name is not served here."""

    code = "unknown_model"
    status = 400


class UnsupportedFormat(VoxgateError):
    """The audio format is not supported."""

    code = "unsupported_format"
    status = 400


class UnsupportedSampleRate(VoxgateError):
    """The sample rate is not supported."""

    code = "unsupported_sample_rate"
    status = 400


class UnsupportedLanguage(VoxgateError):
    """The voice does not speak this language."""

    code = "unsupported_language"
    status = 400


class Unauthorized(VoxgateError):
    """Missing or wrong API key."""

    code = "unauthorized"
    status = 401


class NotFound(VoxgateError):
    """No such resource."""

    code = "not_found"
    status = 404


class NotSupported(VoxgateError):
    """The engine cannot do this (e.g. voice cloning on a non-Base model)."""

    code = "not_supported"
    status = 400


class TooManyStreams(VoxgateError):
    """The client has too many open streams."""

    code = "too_many_streams"
    status = 429
    retry_after_s = 1


class UnknownEngine(VoxgateError):
    """No engine is registered under this name."""

    code = "unknown_engine"
    status = 400


class EngineFailure(VoxgateError):
    """The engine failed while synthesising."""

    code = "engine_error"
    status = 500


class NotReady(VoxgateError):
    """The server is still warming up."""

    code = "not_ready"
    status = 503


class Preempted(VoxgateError):
    """The engine stopped a stream nobody listened to, to give its place to one somebody
    listens to; the caller voices that text again later (the WebSocket gateway does, for a
    dropped session). Never reaches a client."""

    code = "preempted"
    status = 503
    retry_after_s = 1


class Busy(VoxgateError):
    """The server is at its stream limit."""

    code = "busy"
    status = 503
    retry_after_s = 1


class InvalidAudio(VoxgateError):
    """Reference audio that cannot be decoded, or whose rate, length or size is out of bounds."""

    code = "invalid_audio"
    status = 400


class InvalidSdp(VoxgateError):
    """A WebRTC offer that is not a usable session description."""

    code = "invalid_sdp"
    status = 400


class Forbidden(VoxgateError):
    """An authenticated request for something that is not the client's (another key's session
    or voice, an admin endpoint), or from a browser origin the server does not allow."""

    code = "forbidden"
    status = 403


class VoiceExists(VoxgateError):
    """A voice id already taken by another client."""

    code = "voice_exists"
    status = 409


class TooManyVoices(VoxgateError):
    """The client keeps `max_voices_per_client` cloned voices already."""

    code = "too_many_voices"
    status = 429


class TooManyCalls(VoxgateError):
    """The client has `agent_max_calls_per_client` voice-agent calls open."""

    code = "too_many_calls"
    status = 429


class TooManySessions(VoxgateError):
    """The client has `max_sessions_per_client` WebSocket sessions open."""

    code = "too_many_sessions"
    status = 429


class RateLimited(VoxgateError):
    """The client sends messages faster than the server takes them."""

    code = "rate_limited"
    status = 429


class RequestTimeout(VoxgateError):
    """The request's body did not arrive within `header_timeout_s`."""

    code = "request_timeout"
    status = 408
