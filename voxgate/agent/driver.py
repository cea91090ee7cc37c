"""The I/O around one voice call: mic audio -> VAD -> duplex controller -> STT / LLM -> TTS ->
the outbound track, and the controller's actions carried out (see `controller.py`).

The transport is anything with the `Outbound` and `EventSink` shapes below (the WebRTC peer
in `webrtc.py`, or a test's loopback); mic audio comes in as 16-bit PCM frames. One task
reads the mic and runs the VAD (a 32 ms window costs ~0.25 ms, so it stays on the loop), one
ticks the controller every `tick_s`, and each reply runs as its own task through the bridge's
`ReplyPipeline`, its audio tagged (trace id, segment) so the track reports what was played.
STT runs on the server's executor; with a transcriber that gives word times (whisper) it
streams: partial decodes while the user speaks, only the tail after the end of turn
(`stt_stream.py`). Every finished turn's trace goes to a JSONL file (if set)
and to `/metrics` as `voxgate_agent_seconds{stage}` (from the end of the user's turn).
Each reply's LLM request takes a slot of the server's fair LLM limiter as the call's `client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from voxgate.agent import controller as fsm
from voxgate.agent import vad as vad_events
from voxgate.agent.capture import ReplyCapture
from voxgate.agent.host import AgentHost
from voxgate.agent.stt import Transcriber, WordTranscriber
from voxgate.agent.stt_stream import FinalTranscript, StreamingStt
from voxgate.agent.vad import VAD_RATE, StreamingVad
from voxgate.bridge.llm import Conversation, LLMClient
from voxgate.bridge.pipeline import ChunkStream, ReplyPipeline
from voxgate.bridge.segmenter import Segment, Segmenter
from voxgate.speech.clock import PlaybackClock
from voxgate.speech.stream import EngineStream
from voxgate.types import SynthesisRequest, VoxgateError

log = logging.getLogger(__name__)

LIVE_TURN_PRIORITY = 50  # a reply someone is waiting for goes ahead of other speech (HTTP allows -100..100)


class Outbound(Protocol):
    """The agent's voice track: paced playout of tagged audio."""

    on_published: Callable[[Hashable, float, float], None] | None  # (tag, seconds, t)
    on_drained: Callable[[Hashable, float], None] | None  # (end tag, t)

    def enqueue(self, pcm: np.ndarray, sample_rate: int, tag: Hashable) -> None: ...

    def end(self, tag: Hashable) -> None: ...

    def flush(self, tag: Hashable | None = None) -> int: ...

    def hold(self, on: bool) -> None:
        """While on, publish silence and keep what is queued."""


class EventSink(Protocol):
    def send_event(self, message: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class AgentConfig:
    system: str | None = "You are a helpful voice assistant. Answer briefly, in one or two sentences."
    max_tokens: int = 120
    temperature: float | None = 0.7
    tick_s: float = 0.05
    history_s: float = 60.0  # mic audio kept for STT
    history_chars: int = 6000  # conversation sent to the LLM (fit to its context)
    trace_file: Path | None = None  # one JSON line per finished turn
    capture_dir: Path | None = None  # each reply's enqueued audio as <trace_id>.wav (regression harness)
    stt_streaming: bool = False  # transcribe while the user speaks (word-timed transcribers; bench/stt_streaming.py)
    stt_partial_s: float = 2.0  # new speech between two partial decodes (a pause decodes at once)


class CallDriver:
    def __init__(
        self,
        state: AgentHost,
        call_id: str,
        outbound: Outbound,
        events: EventSink,
        transcriber: Transcriber,
        vad: StreamingVad,
        config: AgentConfig | None = None,
        controller: fsm.ControllerConfig | None = None,
        client: str | None = None,  # who the limits count: the caller's API key index or address
    ) -> None:
        self.state, self.call_id, self.outbound, self.events = state, call_id, outbound, events
        self.client = client or f"agent:{call_id}"
        self.transcriber, self.vad = transcriber, vad
        self.config = config or AgentConfig()
        conversation = Conversation(system=self.config.system, max_chars=self.config.history_chars)
        self.ctl = fsm.DuplexController(controller or fsm.ControllerConfig(), conversation, call_id=call_id)
        self.replies: dict[str, tuple[ReplyPipeline, asyncio.Task[None]]] = {}
        self.traces: list[fsm.TurnTrace] = []
        self._playing_until: dict[str, float] = {}  # trace -> when its last published frame ends
        self._silent_at: dict[str, float] = {}  # trace -> when a flushed reply went silent on the wire
        self._mic = np.zeros(0, dtype=np.int16)
        self._mic_start = 0  # sample index (16 kHz) of self._mic[0]
        self._last_speech: tuple[int, int] | None = None  # the latest utterance's samples, for STT
        self._streaming = self.config.stt_streaming and isinstance(transcriber, WordTranscriber)
        self._stream: StreamingStt | None = None  # the utterance being heard, transcribed as it goes
        self._last_stream: StreamingStt | None = None  # the utterance that just ended
        self._stt: dict[str, list[dict[str, Any]]] = {}  # trace -> what each part's STT cost, for its trace
        outbound.on_published = self._published
        outbound.on_drained = self._drained

    # ------------------------------------------------------------------ the call

    async def run(self, mic: AsyncIterator[tuple[np.ndarray, float]]) -> None:
        """Until the mic ends (the call hung up) or the task is cancelled."""
        ticker = asyncio.get_running_loop().create_task(self._tick())
        try:
            async for pcm, _t in mic:
                self._hear(pcm)
        finally:
            ticker.cancel()
            for stream in (self._stream, self._last_stream):
                if stream is not None:
                    stream.close()
            self._handle(fsm.CallEnded(at=time.perf_counter()))
            for pipeline, task in list(self.replies.values()):
                pipeline.cancel()
                task.cancel()

    def _hear(self, pcm: np.ndarray) -> None:
        self._keep(pcm)
        for event in self.vad.push(pcm):
            now = time.perf_counter()
            if isinstance(event, vad_events.SpeechStarted):
                self._stream = self._open_stream(event.start_sample)
                self._handle(fsm.SpeechStarted(at=now))
            elif isinstance(event, vad_events.SpeechEnded):
                self._last_speech = (event.start_sample, event.end_sample)
                self._last_stream, self._stream = self._stream, None
                voice_end = now - max(0, event.sample - event.end_sample) / VAD_RATE  # the mic runs in real time
                self._handle(fsm.SpeechEnded(at=now, end_of_turn=event.end_of_turn, voice_end=voice_end))
        if self.vad.segmenter.hearing_voice:  # a reply nobody heard yet waits to see if it is speech
            self._handle(fsm.VoiceHeard(at=time.perf_counter()))
        if self._stream is not None:  # from the start of speech to the end of the turn
            voiced = self.vad.in_speech and self.vad.last_probability >= self.vad.segmenter.config.release
            self._stream.offer(self._mic_start + len(self._mic), pause=not voiced)

    def _open_stream(self, start: int) -> StreamingStt | None:
        if not self._streaming:
            return None
        transcriber: Any = self.transcriber
        return StreamingStt(transcriber, self.state.executor, self._audio, start, self.config.stt_partial_s)

    def _audio(self, lo: int, hi: int) -> np.ndarray:
        """Mic samples `[lo, hi)` by absolute index (what is still kept of them)."""
        return self._mic[max(lo - self._mic_start, 0) : max(hi - self._mic_start, 0)]

    def _keep(self, pcm: np.ndarray) -> None:
        """Mic audio of the last `history_s` seconds (16 kHz), addressed by absolute sample index."""
        self._mic = np.concatenate([self._mic, pcm.astype(np.int16, copy=False)])
        excess = len(self._mic) - int(self.config.history_s * VAD_RATE)
        if excess > 0:
            self._mic, self._mic_start = self._mic[excess:], self._mic_start + excess

    async def _tick(self) -> None:
        """A Tick every `tick_s`, and one as soon as held audio may go out (not up to a tick later)."""
        while True:
            release = self.ctl.release_at()
            wait = self.config.tick_s
            if release is not None:
                wait = min(wait, max(0.0, release - time.perf_counter()))
            await asyncio.sleep(wait)
            self._handle(fsm.Tick(at=time.perf_counter()))

    # ------------------------------------------------------------------ actions

    def _handle(self, event: Any) -> None:
        for action in self.ctl.handle(event):
            try:
                self._do(action)
            except Exception:  # one failed action must not end the call
                log.exception("call %s: %s failed", self.call_id, type(action).__name__)

    def _do(self, action: Any) -> None:
        match action:
            case fsm.StartStt():  # the utterance is read now: more speech may end before the task starts
                self._spawn(self._transcribe(action, self._last_speech, self._last_stream))
            case fsm.StartReply():
                self._start_reply(action)
            case fsm.FlushAudio():
                self.outbound.flush()  # no frame queued before it is published after it
                now = time.perf_counter()  # so the reply is silent once the frame on the wire has played
                self._silent_at[action.trace_id] = max(now, self._playing_until.get(action.trace_id, now))
            case fsm.HoldAudio():
                self.outbound.hold(action.hold)
            case fsm.CancelReply():
                pipeline, _task = self.replies.pop(action.trace_id, (None, None))
                if pipeline is not None:
                    pipeline.cancel()
            case fsm.Notify():
                self.events.send_event(action.message)
            case fsm.TraceDone():
                self._trace(action.trace)
            case _:
                pass  # Mark: the trace carries the marks

    async def _transcribe(
        self, action: fsm.StartStt, span: tuple[int, int] | None, stream: StreamingStt | None
    ) -> None:
        pcm = self._audio(*span) if span is not None else np.zeros(0, dtype=np.int16)
        text = ""
        if len(pcm):
            try:
                final = await self._final_transcript(pcm, span, stream)
                text = final.text
                self._stt.setdefault(action.trace_id, []).append(_stt_row(final, stream is not None))
            except VoxgateError as exc:
                log.warning("call %s: STT failed: %s", self.call_id, exc.message)
        self._handle(fsm.Transcript(action.trace_id, action.part, text, at=time.perf_counter()))

    async def _final_transcript(self, pcm: np.ndarray, span: Any, stream: StreamingStt | None) -> FinalTranscript:
        if stream is not None:
            return await stream.finish(span[1])
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.state.executor, self.transcriber.transcribe, pcm, VAD_RATE)
        return FinalTranscript(result.text, result.duration_s, result.duration_s, False, result.took_s, 0, 0)

    def _start_reply(self, action: fsm.StartReply) -> None:
        trace = action.trace_id
        try:
            config = self.state.llm_config(max_tokens=self.config.max_tokens, temperature=self.config.temperature)
        except VoxgateError as exc:
            self._handle(fsm.LlmFailed(trace, exc.message, at=time.perf_counter()))
            return
        engine = self.state.require_engine()
        voice = self.state.voice_plan(None, "pcm", None, None).request
        clock = PlaybackClock()  # the caller's: the reply's audio as it is queued for the call

        def synthesise(segment: Segment) -> ChunkStream:
            self._handle(fsm.SegmentStarted(trace, segment.index, segment.text, at=time.perf_counter()))
            request = SynthesisRequest(
                text=segment.text, voice=voice.voice, language=voice.language, priority=LIVE_TURN_PRIORITY
            )

            def engine_stream(text: str) -> ChunkStream:
                return EngineStream(engine, replace(request, text=text), self.state.engine_pool, clock=clock)

            opener = self.state.opener(request, engine_stream) if segment.kind == "starter" else None
            return opener or engine_stream(segment.text)  # "Sure." plays from memory

        openers = self.state.starters.phrases(voice.voice) if self.state.settings.starter_cache else []
        pipeline = ReplyPipeline(synthesise, Segmenter(openers=openers))
        llm = LLMClient(config)
        task = asyncio.get_running_loop().create_task(self._speak(trace, pipeline, llm, list(action.messages), clock))
        self.replies[trace] = (pipeline, task)

    async def _speak(
        self, trace: str, pipeline: ReplyPipeline, llm: LLMClient, messages: list[dict],
        clock: PlaybackClock | None = None,
    ) -> None:  # fmt: skip
        clock = clock or PlaybackClock()

        async def deltas() -> AsyncIterator[str]:  # in the pipeline's producer: a barge-in ends a wait too
            async with self.state.llm_limiter.slot(self.client):
                async for delta in llm.stream(messages):
                    self._handle(fsm.LlmDelta(trace, delta, at=time.perf_counter()))
                    yield delta

        first = True
        capture = ReplyCapture(self.config.capture_dir, trace) if self.config.capture_dir else None
        limiter, slot = self.state.limiter, False
        try:
            await limiter.wait(self.client)  # a reply is a stream: it waits its turn (a barge-in ends the wait)
            slot = True
            async for segment, chunk in pipeline.run(deltas()):
                if first:
                    first = False
                    self._handle(fsm.TtsFirstAudio(trace, at=time.perf_counter()))
                clock.add(chunk.duration_s, time.perf_counter())
                self.outbound.enqueue(chunk.samples, chunk.sample_rate, (trace, segment.index))
                if capture is not None:
                    capture.add(chunk.samples, chunk.sample_rate)
            if not pipeline.cancelled:
                self._handle(fsm.LlmDone(trace, at=time.perf_counter()))
                self.outbound.end(trace)
        except VoxgateError as exc:
            self._handle(fsm.LlmFailed(trace, exc.message, at=time.perf_counter()))
            self.outbound.end(trace)
        finally:
            if slot:
                limiter.release(self.client, in_session=True)
            if capture is not None:  # before any await: a cancelled reply keeps what it enqueued
                capture.save()
            await llm.aclose()
            self.replies.pop(trace, None)

    # ------------------------------------------------------------------ the track

    def _published(self, tag: Hashable, seconds: float, t: float) -> None:
        if isinstance(tag, tuple) and len(tag) == 2:
            self._playing_until[tag[0]] = t + seconds
            self._handle(fsm.AudioSent(tag[0], tag[1], seconds, at=t))

    def _drained(self, tag: Hashable, t: float) -> None:
        if isinstance(tag, str):
            self._handle(fsm.PlayoutDone(tag, at=t))

    # ------------------------------------------------------------------ traces

    def _trace(self, trace: fsm.TurnTrace) -> None:
        self.traces.append(trace)
        marks = trace.marks
        self._playing_until.pop(trace.trace_id, None)
        silent = self._silent_at.pop(trace.trace_id, None)
        if silent is not None and "cancel" in marks:
            marks["silence"] = silent  # the reply's last audio left the server (cancel -> silence)
            self.state.metrics.agent.labels("cancel_to_silence").observe(max(0.0, silent - marks["cancel"]))
        end = marks.get("vad_end")
        if end is not None:
            for stage in ("stt_done", "llm_first_token", "first_segment", "tts_first_audio", "first_frame_published"):
                if stage in marks:
                    self.state.metrics.agent.labels(stage).observe(max(0.0, marks[stage] - end))
        self.state.metrics.agent_turns.labels(trace.status).inc()
        stt = self._stt.pop(trace.trace_id, [])
        if self.config.trace_file is not None:
            row = {"call_id": self.call_id, **asdict(trace), "stt": stt}
            with contextlib.suppress(OSError), self.config.trace_file.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or (t.exception() and log.error("call task: %r", t.exception())))


def _stt_row(final: FinalTranscript, streamed: bool) -> dict[str, Any]:
    """What one part's STT cost after the end of its speech, for the turn's trace line."""
    return {"streaming": streamed, "audio_s": round(final.audio_s, 3), "tail_audio_s": round(final.tail_audio_s, 3),
            "early": final.early, "tail_ms": round(1000 * final.tail_s, 1), "partials": final.partials,
            "committed_words": final.committed_words}  # fmt: skip
