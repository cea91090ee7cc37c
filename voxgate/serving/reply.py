"""One LLM reply spoken while it is written: what the bridge's transports (server-sent events,
multipart, WebSocket) share.

`Reply.events()` yields `SegmentStarted` when a segment starts speaking, `AudioOut` pieces of
16-bit PCM (at most `chunk_ms` each, so a stop takes effect within one piece), and one
`ReplyDone` at the end. A starter segment that is a cached opener (the starter cache) is
played from memory at once and the engine speaks only what follows it. `stop()` is barge-in;
`ReplyDone.spoken` is the text that was handed out, or, when the client says how much it
played (`played_ms`), the text it heard. Per-reply timings go to `/metrics` as well.

The LLM request waits for a slot of the server's fair LLM limiter (`state.llm_limiter`) under
the reply's `client` identity, held until the LLM has written its last word (the speech after
it needs no LLM slot). HTTP takes it before the response starts (`hold`), so `busy` is a 503;
otherwise the reply takes it as it starts, and a refusal ends it with a `busy` failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from voxgate.bridge.llm import LLMClient
from voxgate.bridge.pipeline import ChunkStream, ReplyPipeline, heard_text
from voxgate.bridge.segmenter import Segment, Segmenter
from voxgate.serving.fair import Lease
from voxgate.serving.state import ServerState
from voxgate.speech.clock import PlaybackClock
from voxgate.speech.pieces import WirePieces
from voxgate.speech.stream import EngineStream
from voxgate.types import SynthesisRequest, VoxgateError


class ReplyOptions(BaseModel):
    """How a reply is spoken (the HTTP body's and the WebSocket `config` message's fields)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    voice: str | None = Field(None, max_length=128)
    language: str | None = Field(None, max_length=32)
    policy: Literal["block", "latest"] = "block"
    max_tokens: int | None = Field(None, ge=1, le=4096)
    temperature: float | None = Field(None, ge=0, le=2)
    pacing: bool = Field(False, description="send audio in real time, `pacing_lead_ms` ahead of playback")
    pacing_lead_ms: int = Field(300, ge=0, le=10_000)


@dataclass(frozen=True, slots=True)
class SegmentStarted:
    index: int
    text: str
    kind: str
    trigger: str
    cached: bool  # its audio (or its start) came from the starter cache

    def message(self) -> dict[str, Any]:
        return {"type": "segment", **asdict(self)}


@dataclass(frozen=True, slots=True)
class AudioOut:
    segment: int
    pcm: bytes


@dataclass(slots=True)
class ReplyDone:
    status: str  # completed | cancelled | failed | client_disconnect
    spoken: str
    segments: int
    dropped: int
    queue_peak: int
    triggers: dict[str, int]
    starter_cached: bool
    timings_ms: dict[str, float]
    error: dict[str, str] = field(default_factory=dict)
    unspeakable: int = 0  # segments with nothing to say (emoji or markup only), not synthesised

    def message(self) -> dict[str, Any]:
        out = {"type": "done", **asdict(self)}
        out.update(out.pop("error"))  # code and message, on a failure
        return out


class Reply:
    """Admitted at construction (a stream slot, or a typed refusal); spoken by `events()`.
    `client` is the identity the limits count (the API key's index, else the peer address)."""

    def __init__(
        self, state: ServerState, options: ReplyOptions, messages: list[dict[str, str]], t_in: float, client: str
    ) -> None:
        config = state.llm_config(max_tokens=options.max_tokens, temperature=options.temperature)
        self.state, self.options, self.messages, self.t_in, self.client = state, options, messages, t_in, client
        self.plan = state.voice_plan(options.voice, "pcm", None, options.language, client=client)
        self.engine = state.require_engine()
        voice = self.plan.request.voice
        openers = state.starters.phrases(voice) if state.settings.starter_cache else []
        self.pipeline = ReplyPipeline(self._synthesise, Segmenter(openers=openers), options.policy)
        self.llm = LLMClient(config)
        self._lease: Lease | None = None  # the LLM slot, while held
        self.marks: dict[str, float] = {}
        self.spans: list[list[Any]] = []  # [text, seconds of audio handed out] per segment
        self.played_s: float | None = None  # how much the client said it played, at a stop
        self._cached: set[int] = set()
        self.clock = PlaybackClock()  # the client's: audio handed out so far, played at real time
        state.limiter.acquire(client)  # last: nothing above may fail after the slot is taken
        self._released = False

    def hold(self, lease: Lease) -> None:
        """An LLM slot taken for this reply before it starts (HTTP: before the response)."""
        self._lease = lease

    def stop(self, played_ms: float | None = None) -> None:
        """Barge-in: the LLM stream and all synthesis stop now."""
        if played_ms is not None and self.played_s is None:
            self.played_s = played_ms / 1000
        self.pipeline.cancel()

    def close(self) -> None:
        """Stop and free the slot if `events()` never ran to its end (the client left early)."""
        if not self._released:
            self.pipeline.cancel()
            self._release()

    def spoken(self) -> str:
        if self.played_s is None:
            return self.pipeline.spoken()
        return heard_text([(text, seconds) for text, seconds in self.spans], self.played_s)

    async def events(self) -> AsyncIterator[SegmentStarted | AudioOut | ReplyDone]:
        wire = WirePieces("pcm", self.engine.sample_rate, self.plan.sample_rate, self.state.settings.chunk_ms)
        bytes_per_s = wire.bytes_per_s
        current, status, error = -1, "client_disconnect", {}
        try:
            async for segment, chunk in self.pipeline.run(self._deltas()):
                if segment.index != current:
                    current = segment.index
                    self.spans.append([segment.text, 0.0])
                    yield SegmentStarted(segment.index, segment.text, segment.kind, segment.trigger,
                                         segment.index in self._cached)  # fmt: skip
                for part in wire.pieces(chunk.samples, chunk.pcm16):
                    if self.options.pacing:
                        await self._pace()
                    if self.pipeline.cancelled:
                        break
                    self.clock.add(len(part) / bytes_per_s, time.perf_counter())
                    self.marks.setdefault("first_audio", time.perf_counter())
                    yield AudioOut(segment.index, part)
                    self.marks["last_audio"] = time.perf_counter()
                    self.spans[-1][1] += len(part) / bytes_per_s
            status = "cancelled" if self.pipeline.cancelled else "completed"
        except VoxgateError as exc:
            status, error = "failed", {"code": exc.code, "message": exc.message}
        finally:
            if status != "completed":
                self.pipeline.cancel()
            await self.llm.aclose()
            done = self._finish(status, error)
        yield done

    # ------------------------------------------------------------------ inside

    def _synthesise(self, segment: Segment) -> ChunkStream:
        voice, language = self.plan.request.voice, self.plan.request.language
        request = SynthesisRequest(text=segment.text, voice=voice, language=language)

        def engine(text: str) -> ChunkStream:
            return EngineStream(self.engine, replace(request, text=text), self.state.engine_pool, clock=self.clock)

        opener = self.state.opener(request, engine) if segment.kind == "starter" else None
        if opener is None:
            return engine(segment.text)
        self._cached.add(segment.index)
        return opener

    async def _pace(self) -> None:
        """Wait until the client's buffer (audio sent but not yet played, on its playback clock)
        is at most `pacing_lead_ms`; a stop ends the wait."""
        wait = self.clock.wait_s(time.perf_counter(), self.options.pacing_lead_ms / 1000)
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pipeline.stopped.wait(), wait)

    def _release(self) -> None:
        if self._lease is not None:
            self._lease.release()
        if not self._released:
            self._released = True
            self.state.limiter.release(self.client)

    async def _deltas(self) -> AsyncIterator[str]:
        """The LLM's reply, written under an LLM slot (run by the pipeline's producer task,
        so a stop cancels a wait for the slot as well as the stream)."""
        if self._lease is None:
            self._lease = await self.state.llm_limiter.acquire(self.client)
        try:
            async for delta in self.llm.stream(self.messages):
                self.marks.setdefault("llm_first_token", time.perf_counter())
                yield delta
        finally:
            self._lease.release()

    def _finish(self, status: str, error: dict[str, str]) -> ReplyDone:
        self._release()
        stats = self.pipeline.stats
        stopped = self.pipeline.stopped_at if status == "cancelled" else None
        if stats.first_cut_at is not None:
            self.marks["first_segment"] = stats.first_cut_at
        timings = _timings(self.marks, self.t_in, stopped)
        metrics = self.state.metrics
        for stage, ms in timings.items():
            metrics.bridge.labels(stage).observe(ms / 1000)
        for trigger, n in stats.triggers.items():
            metrics.bridge_segments.labels(trigger).inc(n)
        metrics.bridge_dropped.inc(stats.dropped)
        metrics.bridge_queue_peak.observe(stats.queue_peak)
        metrics.bridge_replies.labels(status).inc()
        return ReplyDone(status, self.spoken(), stats.segments, stats.dropped, stats.queue_peak, dict(stats.triggers),
                         0 in self._cached, timings, error, stats.unspeakable)  # fmt: skip


def _timings(marks: dict[str, float], t_in: float, stopped_at: float | None) -> dict[str, float]:
    """Milliseconds from the request in to each first, and from a stop to the last audio."""
    out = {k: round(1000 * (marks[k] - t_in), 2) for k in ("llm_first_token", "first_segment", "first_audio")
           if k in marks}  # fmt: skip
    if stopped_at is not None:
        out["cancel_to_silence"] = round(1000 * max(0.0, marks.get("last_audio", stopped_at) - stopped_at), 2)
    return out
