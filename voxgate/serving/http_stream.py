"""A validated speech request streamed as an HTTP response (`/tts/stream`, `/v1/audio/speech`):
admission, the starter cache, the engine's chunks cut into wire pieces, OpenAI's SSE events."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from fastapi import Request
from fastapi.responses import Response

from voxgate.serving.protocol import error_of
from voxgate.serving.state import ServerState, StreamPlan
from voxgate.serving.stream import AudioStreamResponse, DisconnectWatch, StreamOutcome
from voxgate.speech.pieces import WirePieces
from voxgate.speech.starter import StarterHit
from voxgate.speech.stream import EngineStream
from voxgate.text import count_units
from voxgate.types import AudioChunk, Timing, VoxgateError


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

    chunk_ms = state.settings.chunk_ms
    wire = WirePieces(plan.fmt, engine.sample_rate, plan.sample_rate, chunk_ms)
    body = _audio_pieces(wire, outcome.timing, hit, first, stream)
    headers = {
        "x-sample-rate": str(plan.sample_rate),
        "x-chunk-ms": str(chunk_ms),
        "x-request-id": req.request_id,
        "x-cache-starter": "true" if hit else "false",
        "x-audio-format": plan.fmt,
        "cache-control": "no-store",
    }
    media_type = wire.media_type
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
    wire: WirePieces,
    timing: Timing,
    hit: StarterHit | None,
    first: AudioChunk | None,
    stream: EngineStream | None,
) -> AsyncIterator[bytes]:
    """Encoded wire pieces: the cached opener (if any), then the engine's chunks; a stream that
    ends early (the client gone) frees its codec."""
    try:
        if hit is not None:
            for part in wire.pieces(hit.samples):
                yield part
                if stream is not None:
                    stream.start()
            timing.audio_s = wire.audio_s
        chunk = first if first is not None or stream is None else await stream.next()
        while chunk is not None:
            for part in wire.pieces(chunk.samples, chunk.pcm16):
                yield part
            timing.audio_s = wire.audio_s
            chunk = await stream.next() if stream is not None else None
        tail = wire.flush()
        timing.audio_s = wire.audio_s
        if tail:
            yield tail
    finally:
        wire.close()


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
