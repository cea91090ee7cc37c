"""The one engine protocol every transport consumes, and helpers around it.

An engine turns a `SynthesisRequest` into a *lazy* iterator of `AudioChunk`s: work happens
as the caller iterates, so a caller that stops iterating (or sets the `CancelToken`) stops
the engine between chunks. Non-streaming synthesis is `collect()` of that same stream.
Engines are synchronous and thread-safe for concurrent streams; asyncio lives in serving/.

No engine call gets more than `max_piece_chars` characters: `stream_pieces` (what
`EngineStream` and `collect` call) speaks longer text piece by piece (`voxgate.text.split_pieces`)
as one stream, so an engine's memory and the time one call holds the CPU stay bounded
whatever a client sends.

The contract is explicit (engines subclass `Engine`, which gives the defaults): besides
the methods, `parallel_calls` says how many stream calls can usefully compute at once in the
calling thread (the server then runs engine calls on that many threads, most urgent first:
`voxgate.speech.workers`), or None for an engine that queues its own work (one thread per
stream, mostly waiting); `counters()` gives numbers for /metrics (none by default);
`opens_at_once` says `open_polled` may run on the caller's event loop (it waits on nothing slow);
`capacity(utilization)` says how many streams the engine can keep ahead of real time at once
from what it has measured (the batched qwen3 runner: its step cost against rows), or None when
it cannot say (the server then admits up to its configured limits only).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from voxgate.config import Settings
from voxgate.text import Piece, Unit, split_pieces, split_units
from voxgate.types import (
    AudioChunk,
    CancelToken,
    InvalidRequest,
    SynthesisRequest,
    UnknownVoice,
    UnsupportedLanguage,
    VoiceInfo,
)

if TYPE_CHECKING:  # imported where a rate is asked for: PyAV (FFmpeg) is not needed to run an engine
    from voxgate.audio_tempo import TempoStretch

MIN_SPEED, MAX_SPEED = 0.25, 4.0
DEFAULT_MAX_PIECE_CHARS: int = Settings.model_fields["max_piece_chars"].default


@runtime_checkable
class Engine(Protocol):
    name: str
    sample_rate: int
    parallel_calls: int | None = None  # calls computing at once in the caller's thread; None: queued inside
    native_speed: bool = True  # it speaks at `request.speed` itself; False: `stream_pieces` stretches its audio
    # `open_polled` is quick host work that waits on nothing slow (token ids, a queue put under a
    # lock held only for bookkeeping): the caller may open on its event loop instead of a worker
    # thread (see `EngineStream.start`).
    opens_at_once: bool = False

    def counters(self) -> dict[str, dict[str, float]]:
        """Numbers for /metrics by group (`<group>_now` groups are gauges); none by default."""
        return {}

    def capacity(self, utilization: float) -> int | None:
        """Streams this engine can voice at once while busy at most `utilization` of real
        time (from its measured cost), or None when it cannot say; at least 1 when known."""
        return None

    def voices(self) -> list[VoiceInfo]:
        """Voices this engine offers; the first is the default."""
        ...

    def warmup(self) -> None:
        """Run once before serving so the first real request is warm."""
        ...

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        """Yield audio chunk by chunk; return early once `cancel.cancelled` is set."""
        ...

    def open_polled(
        self, request: SynthesisRequest, cancel: CancelToken, wake: Callable[[], None]
    ) -> PolledStream | None:
        """The same stream for a reader that polls instead of iterating on a thread (an engine
        that computes elsewhere, e.g. a batched GPU runner): starts it and returns its source,
        calling `wake` from any thread whenever there is something to poll; None when this
        engine has no such path (the default: the caller iterates `stream`)."""
        return None

    def close(self) -> None:
        """Free resources; the engine is not used afterwards."""
        ...


class PolledStream(Protocol):
    """What `Engine.open_polled` returns: `poll()` gives the chunks ready now (never blocks;
    raises the engine's failure), `ended` once the last was given, `close()` when the reader
    stops."""

    ended: bool

    def poll(self) -> list[AudioChunk]: ...

    def close(self) -> None: ...


@runtime_checkable
class VoiceCloner(Protocol):
    """An engine that can learn new voices from reference audio."""

    def add_voice(self, voice_id: str, audio: np.ndarray, sample_rate: int, ref_text: str | None) -> VoiceInfo:
        """Register `voice_id` from float mono audio (and its transcript, when known)."""
        ...

    def remove_voice(self, voice_id: str) -> None: ...


def collect(
    engine: Engine,
    request: SynthesisRequest,
    cancel: CancelToken | None = None,
    max_piece_chars: int = DEFAULT_MAX_PIECE_CHARS,
) -> AudioChunk:
    """Non-streaming synthesis: the concatenated stream as a single chunk."""
    token = cancel or CancelToken()
    parts: list[np.ndarray] = []
    t_ready = 0.0
    for chunk in stream_pieces(engine, request, token, max_piece_chars):
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


def stream_pieces(
    engine: Engine, request: SynthesisRequest, cancel: CancelToken, max_piece_chars: int = DEFAULT_MAX_PIECE_CHARS
) -> Iterator[AudioChunk]:
    """`engine.stream(request, cancel)`, with text longer than `max_piece_chars` spoken piece
    by piece: one engine call per piece, each started once the one before has ended, so at
    most one piece's work is in memory. The chunks form one stream (`seq` counts on, unit
    ranges are the request's); closing it or setting `cancel` stops the piece in progress
    and starts no other. Text that fits goes to the engine as is."""
    if request.speed != 1.0 and not getattr(engine, "native_speed", True):
        normal = stream_pieces(engine, replace(request, speed=1.0), cancel, max_piece_chars)
        from voxgate.audio_tempo import TempoStretch

        return _stretched(normal, TempoStretch(request.speed, engine.sample_rate))
    if len(request.text) <= max_piece_chars:
        return engine.stream(request, cancel)
    return _piece_by_piece(engine, request, cancel, split_pieces(request.text, max_piece_chars))


def _stretched(chunks: Iterator[AudioChunk], tempo: TempoStretch) -> Iterator[AudioChunk]:
    """An engine's chunks at another speaking rate (`audio_tempo.py`). A chunk the filter has
    not answered yet lends its unit range to the next audio out; the tail comes at the end."""
    seq, held, last = 0, None, None
    for chunk in chunks:
        last = chunk
        out = tempo.process(chunk.samples)
        held = chunk.unit_start if held is None else held
        if len(out):
            yield replace(chunk, samples=out, seq=seq, unit_start=held, pcm16=None)
            seq, held = seq + 1, None
    tail = tempo.flush()
    if last is not None and len(tail):
        yield replace(last, samples=tail, seq=seq, unit_start=held if held is not None else last.unit_end, pcm16=None)


def _piece_by_piece(
    engine: Engine, request: SynthesisRequest, cancel: CancelToken, pieces: list[Piece]
) -> Iterator[AudioChunk]:
    units = _UnitMap(request.text)
    seq = 0
    start, audio_s = request.play_at, 0.0  # a later piece is due when the audio before it runs out
    for piece in pieces:
        if cancel.cancelled:
            return
        play_at = None if start is None else start + audio_s
        chunks = engine.stream(replace(request, text=piece.text, play_at=play_at), cancel)
        local = split_units(piece.text)
        try:
            for chunk in chunks:
                if start is not None and seq == 0:
                    start = max(start, time.perf_counter())  # playback starts with the first audio
                audio_s += chunk.duration_s
                yield units.remap(chunk, piece, local, seq)
                seq += 1
        finally:
            chunks.close()  # type: ignore[attr-defined]  # a close mid-piece runs the engine's cleanup now


class _UnitMap:
    """Turns a piece's unit indices into the whole text's. They differ by more than an offset
    where a cut falls inside a unit (a long run cut between clusters): both halves belong to
    that unit, and a piece ending in its first half has not finished it."""

    def __init__(self, text: str) -> None:
        units = split_units(text)
        self._starts = [u.start for u in units]
        self._ends = [u.end for u in units]

    def remap(self, chunk: AudioChunk, piece: Piece, local: list[Unit], seq: int) -> AudioChunk:
        """`chunk` of `piece` (whose units are `local`) as chunk `seq` of the whole text."""
        return replace(
            chunk,
            seq=seq,
            unit_start=None if chunk.unit_start is None else self._start(piece, local, chunk.unit_start),
            unit_end=None if chunk.unit_end is None else self._end(piece, local, chunk.unit_end),
        )

    def _start(self, piece: Piece, local: list[Unit], index: int) -> int:
        """The text's unit holding the piece's unit `index`."""
        if index >= len(local):
            return self._end(piece, local, len(local))
        return bisect.bisect_right(self._starts, piece.start + local[index].start) - 1

    def _end(self, piece: Piece, local: list[Unit], index: int) -> int:
        """How many of the text's units are finished once the piece's first `index` units are."""
        if index == 0:
            return self._start(piece, local, 0) if local else bisect.bisect_right(self._ends, piece.start)
        return bisect.bisect_right(self._ends, piece.start + local[index - 1].end)
