"""The one engine protocol every transport consumes, and helpers around it.

An engine turns a `SynthesisRequest` into a *lazy* iterator of `AudioChunk`s: work happens
as the caller iterates, so a caller that stops iterating (or sets the `CancelToken`) stops
the engine between chunks. Non-streaming synthesis is `collect()` of that same stream.
Engines are synchronous and thread-safe for concurrent streams; asyncio lives in serving/.

An engine that computes in the calling thread may declare `parallel_calls` (an int): how
many stream calls can usefully run at once. The server then runs engine calls on that many
threads, most urgent first (`voxgate.serving.workers`), instead of one thread per stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from voxgate.types import (
    AudioChunk,
    CancelToken,
    InvalidRequest,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedLanguage,
    VoiceInfo,
)

MIN_SPEED, MAX_SPEED = 0.25, 4.0


@runtime_checkable
class Engine(Protocol):
    name: str
    sample_rate: int

    def voices(self) -> list[VoiceInfo]:
        """Voices this engine offers; the first is the default."""
        ...

    def warmup(self) -> None:
        """Run once before serving so the first real request is warm."""
        ...

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        """Yield audio chunk by chunk; return early once `cancel.cancelled` is set."""
        ...

    def close(self) -> None:
        """Free resources; the engine is not used afterwards."""
        ...


@runtime_checkable
class VoiceCloner(Protocol):
    """An engine that can learn new voices from reference audio."""

    def add_voice(self, voice_id: str, audio: np.ndarray, sample_rate: int, ref_text: str | None) -> VoiceInfo:
        """Register `voice_id` from float mono audio (and its transcript, when known)."""
        ...

    def remove_voice(self, voice_id: str) -> None: ...


def collect(engine: Engine, request: SynthesisRequest, cancel: CancelToken | None = None) -> AudioChunk:
    """Non-streaming synthesis: the concatenated stream as a single chunk."""
    token = cancel or CancelToken()
    parts: list[np.ndarray] = []
    t_ready = 0.0
    for chunk in engine.stream(request, token):
        parts.append(chunk.samples)
        t_ready = chunk.t_ready
    samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return AudioChunk(samples=samples, sample_rate=engine.sample_rate, t_ready=t_ready)


def check_request(engine: Engine, request: SynthesisRequest) -> VoiceInfo:
    """Refuse what this engine cannot do (unknown voice, unspoken language, odd speed)."""
    voices = {v.id: v for v in engine.voices()}
    info = voices.get(request.voice)
    if info is None:
        raise UnknownVoice(f"unknown voice {request.voice!r}; available: {', '.join(voices)}")
    lang = request.language
    if lang is not None and "*" not in info.languages and lang not in info.languages:
        raise UnsupportedLanguage(f"voice {info.id!r} speaks {', '.join(info.languages)}, not {lang!r}")
    if not MIN_SPEED <= request.speed <= MAX_SPEED:
        raise InvalidRequest(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {request.speed}")
    return info
