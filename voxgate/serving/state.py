"""What one running server holds, the checks every request passes, and start-up warm-up."""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from voxgate.audio import FORMATS, AudioFormat, check_output
from voxgate.bridge.llm import LLMConfig, LLMNotConfigured
from voxgate.bridge.pipeline import ChunkStream
from voxgate.config import Settings
from voxgate.engines.base import Engine, check_request, collect
from voxgate.engines.registry import create_engine
from voxgate.serving.auth import Authenticator
from voxgate.serving.fair import FairLimiter
from voxgate.serving.metrics import (
    CLOCK_ORIGIN,
    ENGINE_COUNTS,
    ENGINE_MARKS,
    ENGINE_STAGES,
    FIRST_AUDIO_CLOCKS,
    FIRST_AUDIO_STAGES,
    TIMELINE,
    Metrics,
)
from voxgate.serving.voice_store import VoiceStore
from voxgate.serving.voices import ClonedVoices, OwnerDigests, VoiceOwners
from voxgate.speech.limits import SessionCounter, StreamLimiter
from voxgate.speech.starter import StarterCache, opener_stream
from voxgate.speech.workers import EnginePool
from voxgate.text import check_text, normalize_language
from voxgate.types import (
    NotReady,
    SynthesisRequest,
    Timing,
    UnknownVoice,
    VoiceInfo,
    VoxgateError,
)

log = logging.getLogger(__name__)


class Draining(VoxgateError):
    """The server is shutting down (`VOXGATE_DRAIN_S`): what runs finishes, nothing new starts;
    another replica (or this one, restarted) takes the retry."""

    code = "server_draining"
    status = 503
    retry_after_s = 1


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """A validated request: what to synthesise and how to put it on the wire."""

    request: SynthesisRequest
    fmt: AudioFormat
    sample_rate: int


@dataclass(slots=True)
class ServerState:
    """Everything one running server holds: settings, engine, limits, caches, metrics."""

    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    starters: StarterCache = field(default_factory=StarterCache)
    engine: Engine | None = None
    ready: bool = False
    startup_error: str | None = None
    draining: bool = False  # shutting down: new sessions and streams are refused (serving/lifecycle.py)
    limiter: StreamLimiter = field(init=False)
    auth: Authenticator = field(init=False)  # who a request is (voxgate.serving.auth)
    sessions: SessionCounter = field(init=False)  # open WebSocket sessions per client
    executor: ThreadPoolExecutor = field(init=False)  # blocking work other than engine streams (STT, uploads)
    engine_pool: EnginePool = field(init=False)  # engine stream calls, most urgent first
    timings: deque[dict[str, Any]] = field(init=False)
    voice_owners: VoiceOwners = field(init=False)  # who cloned each voice (serving/voices.py)
    cloned_voices: ClonedVoices = field(init=False)  # cloned voices in the engine and on disk (VOXGATE_DATA_DIR)
    llm: Any = None  # the embedded LLM (voxgate.bridge.embedded.EmbeddedLLM), when started
    llm_error: str | None = None  # why there is no LLM
    llm_limiter: FairLimiter = field(init=False)  # every LLM call's slot, fair across clients (serving/fair.py)

    def __post_init__(self) -> None:
        s = self.settings
        self.limiter = StreamLimiter(s.max_streams, s.max_streams_per_client, self.capacity)
        llm_slots = s.llm_max_concurrent or (s.llm_parallel if s.llm_embedded and not s.llm_url else 16)
        self.llm_limiter = FairLimiter(llm_slots, s.llm_max_per_client, s.llm_max_waiting, s.llm_queue_timeout_s)
        self.metrics.active_streams.set_function(lambda: self.limiter.active)  # exact on every transport
        self.metrics.stream_slots.set_function(lambda: self.limiter.limit)
        self.metrics.streams_waiting.set_function(lambda: self.limiter.waiting)
        self.auth = Authenticator(s.api_keys, s.admin_keys, s.auth_token_ttl_s)
        self.sessions = SessionCounter(s.max_sessions_per_client)
        # one worker per possible stream, plus room for closing cancelled iterators
        self.executor = ThreadPoolExecutor(s.max_streams + 4, thread_name_prefix="voxgate-worker")
        self.engine_pool = EnginePool(s.max_streams + 4)  # sized for the engine once it is loaded
        self.engine_pool.max_piece_chars = s.max_piece_chars
        self.engine_pool.polled = s.engine_polled
        self.timings = deque(maxlen=max(1, s.timings_kept))
        store = VoiceStore(s.data_dir) if s.data_dir is not None else None
        secret = store.secret() if store is not None else secrets.token_bytes(32)
        self.voice_owners = VoiceOwners(s.max_voices_per_client, OwnerDigests(secret, s.api_keys, s.admin_keys))
        self.cloned_voices = ClonedVoices(self.voice_owners, store)

    # ------------------------------------------------------------------ start-up

    def start(self) -> None:
        """Load the engine, warm it up and fill the starter cache (runs on a worker thread)."""
        t0 = time.perf_counter()
        try:
            if self.engine is None:
                self.engine = create_engine(self.settings.engine, self.settings)
            self.cloned_voices.restore(self.engine)
            self.engine_pool.workers = self._engine_workers(self.engine)
            if self.engine.parallel_calls:  # calls compute: fewer hops, new streams first
                self.engine_pool.batch_s = self.settings.engine_batch_ms / 1000
                self.engine_pool.hold_s = self.settings.engine_hold_ms / 1000
            voices = [v.id for v in self.engine.voices()]
            if self.settings.default_voice and self.settings.default_voice not in voices:
                raise UnknownVoice(f"VOXGATE_DEFAULT_VOICE={self.settings.default_voice!r} is not one of {voices}")
            if self.settings.warmup:
                self.engine.warmup()
            if self.settings.starter_cache:
                self._fill_starters(self.engine)
        except Exception as exc:
            self.startup_error = f"{type(exc).__name__}: {exc}"
            log.exception("start-up failed")
            return
        self._start_llm()
        self.metrics.watch_engine(self.engine.counters)
        self.ready = True
        self.metrics.ready.set(1)
        log.info(
            "ready in %.2f s (engine=%s, %d starters)", time.perf_counter() - t0, self.engine.name, len(self.starters)
        )

    def _start_llm(self) -> None:
        """The embedded LLM, unless an external one is configured or it is switched off; a
        failure here leaves TTS serving and is reported by /v1/chat/completions."""
        s = self.settings
        if s.llm_url or not s.llm_embedded:
            return
        from voxgate.bridge.embedded import EmbeddedLLM

        try:
            self.llm = EmbeddedLLM(
                s.llm_model_path, s.llm_context, s.llm_parallel, s.llm_threads or max(1, (os.cpu_count() or 2) // 2)
            )
            self.llm.start()
        except VoxgateError as exc:
            self.llm, self.llm_error = None, exc.message
            log.warning("embedded LLM not started: %s", exc.message)

    def capacity(self) -> int | None:
        """Streams the engine can keep real-time: the operator's figure, else the engine's own
        estimate once it is serving, else None (max_streams alone bounds the streams)."""
        if self.settings.engine_capacity is not None:
            return self.settings.engine_capacity
        if not self.ready or self.engine is None:
            return None
        return self.engine.capacity(self.settings.admission_utilization)

    def _engine_workers(self, engine: Engine) -> int:
        """Threads for engine calls: the setting, else what the engine can run at once (an
        engine computing in the caller's thread), else one per stream (calls that wait)."""
        if self.settings.engine_workers:
            return self.settings.engine_workers
        return engine.parallel_calls or self.engine_pool.workers

    def history_chars(self) -> int:
        """How much conversation to send the LLM: about half the embedded LLM's context (~3
        characters a token), leaving the rest for the reply; an external LLM gets 6000."""
        s = self.settings
        if s.llm_url or not s.llm_embedded:
            return 6000
        return s.llm_context * 3 // 2

    def llm_url(self) -> str | None:
        """The OpenAI-compatible base URL the bridge and /v1/chat/completions use."""
        if self.settings.llm_url:
            return self.settings.llm_url
        return self.llm.url if self.llm is not None else None

    def llm_config(self, **options: Any) -> LLMConfig:
        """How voxgate's own calls reach the LLM: its URL and, for the embedded one, its key."""
        base = self.llm_url()
        if base is None:
            if self.llm_error:
                raise LLMNotConfigured("the embedded LLM failed to start; the server log says why")
            raise LLMNotConfigured("no LLM is configured (VOXGATE_LLM_EMBEDDED=false and no VOXGATE_LLM_URL)")
        key = self.llm.api_key if self.llm is not None and not self.settings.llm_url else None
        return LLMConfig(base, api_key=key, **options)

    def _fill_starters(self, engine: Engine) -> None:
        voice = self.default_voice()
        if voice is None:  # e.g. a voice-clone model before any voice is registered
            return
        info = next(v for v in engine.voices() if v.id == voice)
        for phrase in self.settings.starter_phrases:
            if not self._speaks(info, phrase):
                continue
            audio = collect(engine, SynthesisRequest(text=phrase.strip(), voice=voice))
            self.starters.add(voice, phrase, audio.samples, audio.sample_rate)

    @staticmethod
    def _speaks(voice: VoiceInfo, phrase: str) -> bool:
        """Skip openers in a script the voice does not speak (e.g. 好的 for an English voice)."""
        if "*" in voice.languages or any(lang in ("zh", "ja", "ko") for lang in voice.languages):
            return True
        return phrase.isascii()

    def close(self) -> None:
        self.cloned_voices.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.engine_pool.shutdown(wait=False, cancel_futures=True)
        if self.llm is not None:
            self.llm.close()
        if self.engine is not None:
            self.engine.close()

    # ------------------------------------------------------------------ per request

    def require_engine(self) -> Engine:
        if self.startup_error:
            raise NotReady(f"the engine failed to start: {self.startup_error}")
        if not self.ready or self.engine is None:
            raise NotReady("the server is warming up; poll GET /healthz")
        return self.engine

    def default_voice(self, client: str | None = None) -> str | None:
        """The configured default, else the first voice `client` may use (`None`: any voice)."""
        if self.settings.default_voice:
            return self.settings.default_voice
        voices = self.voice_ids(client)
        return voices[0] if voices else None

    def alias_voices(self) -> dict[str, str]:
        """Each alias (OpenAI's voice names) -> the server voice it speaks with: `voice_map`'s
        pairs, the rest in turn over the server's own voices (the default first, then the
        others by name), so a client limited to OpenAI's names still reaches every voice."""
        pinned = {a.strip(): v.strip() for a, v in (pair.split("=", 1) for pair in self.settings.voice_map)}
        voices = self.engine.voices() if self.engine is not None else []
        own = sorted(v.id for v in voices if self.voice_owners.owned_by(v.id) is None)
        default = self.default_voice(None)
        order = ([default] if default in own else []) + [v for v in own if v != default]
        turn = [alias for alias in self.settings.voice_aliases if alias not in pinned]
        mapped = {alias: order[i % len(order)] for i, alias in enumerate(turn)} if order else {}
        return {**mapped, **pinned}

    def voice_ids(self, client: str | None = None) -> list[str]:
        """The engine's voices that `client` may use: its own cloned ones and the server's
        (`client=None`, for internal callers: all of them)."""
        assert self.engine is not None  # internal invariant: called only once the engine exists
        return [v.id for v in self.engine.voices() if self.voice_owners.may_use(v.id, client)]

    def plan(
        self,
        *,
        text: str | None,
        voice: str | None,
        fmt: str,
        sample_rate: int | None,
        language: str | None = None,
        speed: float = 1.0,
        instructions: str | None = None,
        seed: int | None = None,
        priority: int = 0,
        request_id: str = "",
        client: str | None = None,
        formats: tuple[str, ...] = FORMATS,
    ) -> StreamPlan:
        """Validate a request against the limits and the engine; raises typed errors.

        `text` None: the text comes later, and is checked where it comes (`voice_plan`).
        `client` is the caller's identity: another client's cloned voice is `unknown_voice` to
        it, exactly as a voice that does not exist. Every transport passes it; `None` (no
        owner check) is for the server's own work."""
        engine = self.require_engine()
        if self.draining:
            raise Draining("the server is shutting down and takes no new streams; retry (another replica)")
        if text is not None:
            check_text(text, self.settings.max_text_chars)
        voice = self._voice_for(client, voice)
        request = SynthesisRequest(
            text=text or "",
            voice=voice,
            language=normalize_language(language),
            speed=speed,
            instructions=instructions,
            seed=seed,
            priority=priority,
            request_id=request_id,
        )
        check_request(engine, request)
        rate = check_output(fmt, sample_rate, engine.sample_rate, formats)
        return StreamPlan(request, fmt, rate)  # type: ignore[arg-type]

    def _voice_for(self, client: str | None, voice: str | None) -> str:
        """The voice a request names (or the default), if `client` may use it. The refusal
        lists only the client's voices, so it never reveals another client's."""
        if voice is not None:
            voice = self._named(voice, client)
        if voice is None:
            voice = self.default_voice(client)
            if voice is None:
                raise UnknownVoice("no voices yet that this client may use; register one with POST /v1/voices")
        if client is not None:
            usable = self.voice_ids(client)
            if voice not in usable:
                raise UnknownVoice(f"unknown voice {voice!r}; available: {', '.join(usable)}")
        return voice

    def _named(self, voice: str, client: str | None) -> str | None:
        """A voice by name: the engine's own (exactly, else in any case: "Vivian" is qwen3's
        vivian), else an alias (any case), else the name as given (refused by the caller)."""
        usable = self.voice_ids(client)
        if voice in usable:
            return voice
        folded = {v.casefold(): v for v in usable}
        if voice.casefold() in folded:
            return folded[voice.casefold()]
        aliases = {a.casefold(): a for a in self.settings.voice_aliases}
        if voice.casefold() in aliases:
            return self.alias_voices().get(aliases[voice.casefold()])
        return voice

    def opener(self, request: SynthesisRequest, engine_stream: Callable[[str], ChunkStream]) -> ChunkStream | None:
        """A starter segment's cached opener ("Sure.") then `engine_stream` on the rest, counted
        as a starter-cache hit; None when the cache is off or has no opener for it. What every
        transport that speaks starter segments (bridge, gateway, agent) asks."""
        if not self.settings.starter_cache:
            return None
        stream = opener_stream(self.starters, request, self.settings.chunk_ms, engine_stream)
        if stream is not None:
            self.metrics.starter_hits.inc()
        return stream

    def voice_plan(
        self,
        voice: str | None,
        fmt: str,
        sample_rate: int | None,
        language: str | None,
        client: str | None = None,
        speed: float = 1.0,
        instructions: str | None = None,
        formats: tuple[str, ...] = FORMATS,
    ) -> StreamPlan:
        """`plan` for text that comes later (WebSocket sessions, bridge replies): checks the
        voice, language, speed and output now; each segment's text fills in the request's."""
        return self.plan(text=None, voice=voice, fmt=fmt, sample_rate=sample_rate, language=language, client=client,
                         speed=speed, instructions=instructions, formats=formats)  # fmt: skip

    def record_first_audio(
        self,
        endpoint: str,
        request_id: str,
        clocks: tuple[float, ...],
        opens_utterance: bool,
        marks: dict[str, float] | None = None,
    ) -> None:
        """A WebSocket segment's first audio written: from the segment becoming speakable (its
        last unit received, or a flush) to its first audio bytes handed to the socket. The
        first segment of an utterance is that utterance's TTFA (`voxgate_ttfa_seconds`).
        `clocks` are the perf_counter readings on the way, first (speakable) to last (written);
        with all six, each step is exported as a stage (`FIRST_AUDIO_STAGES`), and the engine's
        own `marks` (`AudioChunk.marks`), where it keeps them, split the engine stage
        (`ENGINE_STAGES`, in the timings ring only)."""
        latency_s = clocks[-1] - clocks[0]
        if opens_utterance:
            self.metrics.ttfa.labels(endpoint, "false").observe(latency_s)
        entry = {"request_id": request_id, "endpoint": endpoint, "status": "first_audio",
                 "t_wall": round(time.time(), 3), "opens_utterance": opens_utterance,
                 "ttfa_ms": round(latency_s * 1000, 3)}  # fmt: skip
        if len(clocks) == len(FIRST_AUDIO_STAGES) + 1:
            steps = [max(0.0, b - a) for a, b in itertools.pairwise(clocks)]
            for stage, seconds in zip(FIRST_AUDIO_STAGES, steps, strict=True):
                self.metrics.first_audio_stages.labels(endpoint, stage).observe(seconds)
            entry["stages_ms"] = {stage: round(s * 1000, 3) for stage, s in zip(FIRST_AUDIO_STAGES, steps, strict=True)}
            if marks is not None and all(k in marks for k in ENGINE_MARKS):
                slot, ready = clocks[2], clocks[3]  # the engine stage: from the slot to the chunk taken
                inner = itertools.pairwise([slot, *(marks[k] for k in ENGINE_MARKS), ready])
                entry["engine_ms"] = {stage: round((b - a) * 1000, 3)  # causal marks on one clock: not clamped
                                      for stage, (a, b) in zip(ENGINE_STAGES, inner, strict=True)}  # fmt: skip
            # Every reading on the process's clock: how a burst's segments queued and were grouped.
            at = {**dict(zip(FIRST_AUDIO_CLOCKS, clocks, strict=True)), **(marks or {})}
            entry["at_ms"] = {k: round((at[k] - CLOCK_ORIGIN) * 1000, 3) for k in TIMELINE if k in at}
            if batch := {k: int(at[k]) for k in ENGINE_COUNTS if k in at}:
                entry["batch"] = batch
        self.timings.append(entry)

    def record(self, endpoint: str, request_id: str, timing: Timing, status: str, starter: bool) -> None:
        """Export one finished stream: metrics, the timings ring and a log line."""
        m = self.metrics
        ttfa, total, rtf = timing.ttfa_s, timing.total_s, timing.rtf
        if ttfa is not None:
            m.ttfa.labels(endpoint, str(starter).lower()).observe(ttfa)
        if total is not None:
            m.duration.labels(endpoint).observe(total)
        if status != "completed":
            m.cancelled.labels(status).inc()
        elif rtf is not None:
            m.rtf.labels(endpoint).observe(rtf)
        if timing.error_code is not None:
            m.errors.labels(timing.error_code).inc()
        m.audio_seconds.inc(timing.audio_s)
        m.engine_chunks.inc(timing.chunks_generated)
        entry = {
            "request_id": request_id,
            "t_req_in": round(time.time() - (time.perf_counter() - timing.t_req_in), 3),
            "endpoint": endpoint,
            "status": status,
            "starter": starter,
            "ttfa_ms": None if ttfa is None else round(ttfa * 1000, 3),
            "total_ms": None if total is None else round(total * 1000, 3),
            "audio_s": round(timing.audio_s, 4),
            "rtf": None if rtf is None else round(rtf, 4),
            "chunks_generated": timing.chunks_generated,
            "pieces_sent": timing.chunks_sent,
            "error": timing.error_code,
        }
        self.timings.append(entry)
        log.info("stream %s", entry)
