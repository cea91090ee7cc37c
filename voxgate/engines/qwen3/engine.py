"""The `qwen3` engine: prompt -> codes frame by frame -> incremental codec decode -> PCM.

Every frame is decoded as soon as it is generated, with the decoder's state carried
across frames, so audio starts after the first frame and nothing is ever re-decoded;
`packet_frames` frames make one chunk. Voices are the checkpoint's speakers (CustomVoice),
one `design` voice whose description comes from the request's `instructions`
(VoiceDesign), or cloned voices (Base).

Two ways to run: *batched* (the default on a GPU) — a runner thread steps every stream
together through CUDA graphs (`batch.py`, `runner.py`), new streams queue by priority and
a full queue answers `Busy`; *eager* (the default on the CPU) — one stream at a time,
exactly the reference's sampling (`generate.py`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from voxgate.audio import resample
from voxgate.engines.base import Engine
from voxgate.engines.qwen3.batch import BatchDecoder
from voxgate.engines.qwen3.codec import DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.generate import generate_codes, max_frames_for
from voxgate.engines.qwen3.hub import resolve_model
from voxgate.engines.qwen3.loader import Qwen3Checkpoint, load_checkpoint
from voxgate.engines.qwen3.prompt import Prompt, PromptBuilder, PromptPlan, TextTable
from voxgate.engines.qwen3.prompt_thread import PromptThread
from voxgate.engines.qwen3.runner import END, Job, Runner
from voxgate.engines.qwen3.scheduler import Scheduler
from voxgate.engines.qwen3.voices import VoiceStore
from voxgate.types import (
    AudioChunk,
    CancelToken,
    EngineFailure,
    InvalidRequest,
    NotSupported,
    SynthesisRequest,
    TextTooLong,
    VoiceInfo,
)

if TYPE_CHECKING:  # the engine itself runs without the server's settings stack (e.g. in benches)
    from voxgate.config import Settings

log = logging.getLogger(__name__)
SAMPLE_RATE = 24000
DESIGN_VOICE = "design"
_LANGUAGES = {"en": "english", "zh": "chinese", "ja": "japanese", "ko": "korean", "de": "german", "fr": "french",
              "ru": "russian", "pt": "portuguese", "es": "spanish", "it": "italian"}  # fmt: skip


class Qwen3Engine(Engine):
    name = "qwen3"
    sample_rate = SAMPLE_RATE
    native_speed = False  # the model speaks at its own pace: other rates are stretched (engines/base.py)

    def __init__(
        self,
        checkpoint: Qwen3Checkpoint,
        packet_frames: int = 1,
        sampling: SamplingParams | None = None,
        cuda_graphs: bool = True,
        compile_graphs: bool = False,
        batched: bool | None = None,
        max_streams: int = 64,
        max_waiting: int = 256,
        kv_capacity: int = 2048,
        prompt_thread: bool = False,
        lead_ms: float = 1500.0,
        text_table: bool | None = None,
        pcm16_step: bool = False,
        trace_steps: int = 0,
    ):
        if packet_frames < 1:
            raise ValueError("packet_frames must be >= 1")
        self.ck = checkpoint
        self.packet_frames = packet_frames
        self.sampling = sampling or SamplingParams.from_generation_config(checkpoint.generation)
        self.prompts = PromptBuilder(checkpoint.config, checkpoint.tokenizer, checkpoint.talker)
        on_gpu = checkpoint.talker.codec_head.weight.device.type == "cuda"
        self.runner: Runner | None = None
        if on_gpu if batched is None else batched:  # captured at start-up, never during a request
            # Batched, a request's prompt is a plan of ids that the runner embeds with the others
            # admitted with it (prompt.py); by default on a GPU (the table is big to build on a CPU).
            table = TextTable(checkpoint.talker) if (on_gpu if text_table is None else text_table) else None
            decoder = BatchDecoder(
                checkpoint.talker,
                checkpoint.codec,
                slots=max_streams,
                capacity=kv_capacity,
                use_graphs=cuda_graphs,
                compile_bodies=compile_graphs,
                sampling=self.sampling,
                text_table=table,
            )
            scheduler = Scheduler(max_streams, max_waiting, max_prefills_per_step=max_streams, buckets=decoder.buckets)
            frame_s = checkpoint.codec.config.samples_per_frame / SAMPLE_RATE
            lead_s = lead_ms / 1000 if lead_ms > 0 else math.inf
            self.runner = Runner(decoder, scheduler, frame_s, lead_s, pcm16=pcm16_step, trace_steps=trace_steps)
        self.eager_reason = (
            None
            if self.runner is not None and self.runner.decoder.stats.captured
            else ("cpu" if not on_gpu else "disabled")
        )
        self._prompt_stream = torch.cuda.Stream() if on_gpu else None
        self._lock = threading.Lock()  # the eager path: one stream at a time
        self._ids = itertools.count()
        self._streams_served = 0
        self.kind = checkpoint.config.model_type
        names = checkpoint.config.talker.language_ids
        self.languages = tuple(code for code, name in _LANGUAGES.items() if name in names)
        self.clones: VoiceStore | None = None
        self._voices: list[VoiceInfo] = []
        if self.kind == "custom_voice":
            speakers = sorted(checkpoint.config.talker.speaker_ids)
            self._voices = [VoiceInfo(s, self.name, self.languages, "Qwen3-TTS CustomVoice speaker") for s in speakers]
        elif self.kind == "voice_design":
            self._voices = [
                VoiceInfo(DESIGN_VOICE, self.name, self.languages, "described by the request's instructions")
            ]
        elif checkpoint.speaker is not None:
            encoder = checkpoint.encoder
            encode = None if encoder is None else (lambda wav: encoder.encode(wav.reshape(1, -1))[0].T)
            self.clones = VoiceStore(checkpoint.speaker.embed, encode, self._preroll)
        else:
            raise EngineFailure(f"unsupported Qwen3-TTS model type {self.kind!r}")
        # Prompts built by one thread for all requests (see prompt_thread.py), or by each caller.
        self._prompt_thread = PromptThread(self._prompt, self._prompt_stream) if prompt_thread else None

    def counters(self) -> dict[str, dict[str, float]]:
        """Numbers for /metrics: graph replays, eager work by reason, and the runner's load."""
        fallbacks: dict[str, float] = {}
        replays = {"decode_step": 0.0}
        load: dict[str, float] = {}
        now: dict[str, float] = {}
        if self.runner is not None:
            stats, run = self.runner.decoder.stats, self.runner.stats
            replays["decode_step"] = float(stats.replays)
            fallbacks.update({k: float(v) for k, v in stats.eager_fallbacks.items()})
            running, waiting = self.runner.load()
            now = {"running": float(running), "waiting": float(waiting)}
            load = {"steps": float(run.steps), "admitted": float(run.admitted), "finished": float(run.finished),
                    "cancelled": float(run.cancelled), "failed": float(run.failed),
                    "queue_seconds": run.queue_seconds, "stream_steps": float(run.rows_stepped),
                    "stream_steps_held": float(run.rows_held),
                    "stream_steps_reader_behind": float(run.rows_stalled),
                    "steps_launched_gpu_idle": float(run.launch_idle),
                    "preempted_no_listener": float(run.preempted)}  # fmt: skip
        if self.eager_reason is not None:
            fallbacks[f"no_graphs_{self.eager_reason}"] = float(self._streams_served)
        return {"graph_replays": replays, "eager_fallbacks": fallbacks, "streams": load, "streams_now": now}

    def capacity(self, utilization: float) -> int | None:
        """Batched: the rows whose steps fit `utilization` of a frame (profiled at start-up,
        then measured live: step_cost.py). Eager: None (one stream at a time, queued)."""
        if self.runner is None:
            return None
        frame_s = self.ck.codec.config.samples_per_frame / SAMPLE_RATE
        return self.runner.capacity(frame_s, utilization)

    def voices(self) -> list[VoiceInfo]:
        if self.clones is None:
            return list(self._voices)
        return [
            VoiceInfo(v.voice_id, self.name, self.languages, f"cloned voice ({v.mode}, {v.duration_s:.1f} s reference)")
            for v in self.clones.all()
        ]

    def add_voice(self, voice_id: str, audio: np.ndarray, sample_rate: int, ref_text: str | None) -> VoiceInfo:
        """Clone a voice from reference audio: in-context with its transcript, else x-vector only."""
        if self.clones is None:
            raise NotSupported(f"voice cloning needs a Base checkpoint; this is {self.kind!r}")
        audio_24k = resample(np.asarray(audio, dtype=np.float32), sample_rate, SAMPLE_RATE)
        with self._lock:
            voice, computed = self.clones.add(voice_id, audio_24k, ref_text, icl=bool(ref_text))
            if self._prompt_stream is not None:  # prompts read it from the side stream: finish it first
                torch.cuda.current_stream().synchronize()
        log.info("voice %s (%s) %s", voice_id, voice.mode, "registered" if computed else "unchanged (cached)")
        return next(v for v in self.voices() if v.id == voice_id)

    def _preroll(self, ref_codes: torch.Tensor) -> DecoderState:
        """The decoder state after decoding a voice's reference codes (output discarded)."""
        state = DecoderState()
        self.ck.codec.decode(ref_codes.T[None].to(self.ck.codec.pre_conv.conv.weight.device), state)
        return state

    def remove_voice(self, voice_id: str) -> None:
        if self.clones is None:
            raise NotSupported(f"voice cloning needs a Base checkpoint; this is {self.kind!r}")
        self.clones.remove(voice_id)

    def warmup(self) -> None:
        """A few frames through every stage (prompt, talker, code predictor, decoder)."""
        if self.clones is not None:  # no voices yet: a neutral x-vector
            hidden = self.ck.config.talker.stack.hidden_size
            weight = self.ck.talker.codec_head.weight
            zero = torch.zeros(hidden, dtype=weight.dtype, device=weight.device)
            prompt = self.prompts.build("Warm up.", speaker_embedding=zero, stream_text=True)
        elif self.kind == "voice_design":
            prompt = self.prompts.build("Warm up.", instruct="A clear voice.")
        else:
            prompt = self.prompts.build("Warm up.", speaker=self._voices[0].id)
        for _ in self._frames(prompt, self.sampling, 5, CancelToken()):
            pass

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        prompt, context, params, limit = self._prepare(request)
        frames = self._frames(prompt, params, limit, cancel, request, context)
        yield from self._chunks(frames, cancel)

    def open_polled(
        self, request: SynthesisRequest, cancel: CancelToken, wake: Callable[[], None]
    ) -> PolledFrames | None:
        """The stream without a thread reading it (`Engine.open_polled`): the request's job is
        submitted to the runner now, and `wake` is called (on the runner's thread) whenever it
        hands the job something; None without a runner (the eager path computes in the caller)."""
        if self.runner is None:
            return None
        prompt, context, params, limit = self._prepare(request)
        self._streams_served += 1
        job = self._job(prompt, params, limit, cancel, request, context)
        job.wake = wake
        self.runner.submit(job)  # Busy when the queue is full
        return PolledFrames(job, self.packet_frames * self.ck.codec.config.samples_per_frame)

    def _prepare(
        self, request: SynthesisRequest
    ) -> tuple[Prompt | PromptPlan, DecoderState | None, SamplingParams, int]:
        """A request's prompt, codec context, sampling and frame limit (refusals typed here)."""
        design = self.ck.config.model_type == "voice_design"
        if design and not request.instructions:
            raise InvalidRequest("a VoiceDesign model needs `instructions` describing the voice")
        if request.speed != 1.0:
            raise NotSupported("the qwen3 engine speaks at its own pace; call it through stream_pieces for speed")
        if self._plans and self.clones is None:  # token ids only: no GPU work to wait for
            prompt, context = self._prompt(request, design)
        elif self._prompt_thread is not None:
            prompt, context = self._prompt_thread.build(request, design)
        else:
            with self._prompt_stream_context():
                prompt, context = self._prompt(request, design)
        params = self.sampling if request.seed is None else replace(self.sampling, seed=request.seed)
        limit = max_frames_for(prompt.text_tokens, params)
        if context is not None:  # a voice's pre-roll uses up codec positions too
            limit = min(limit, self.ck.codec.config.max_position_embeddings - context.position - 2)
        if self.runner is not None:
            decoder = self.runner.decoder
            room = decoder.frame_room(prompt.length)
            if room < 64 or prompt.trailing_rows > decoder.max_text_rows:
                raise TextTooLong("the text is too long for the decoder's KV cache; split it into sentences")
            if room < limit:
                log.info("frame limit %d cut to %d by the KV cache", limit, room)
                limit = room
        return prompt, context, params, limit

    def _job(
        self,
        prompt: Prompt | PromptPlan,
        params: SamplingParams,
        limit: int,
        cancel: CancelToken,
        request: SynthesisRequest | None,
        context: DecoderState | None,
    ) -> Job:
        """The runner's job for a stream; its priority and listener from `request` (none: warm-up)."""
        seed = params.seed if params.seed is not None else secrets.randbits(31)
        if request is None:
            return Job(f"s{next(self._ids)}", prompt, params, seed, limit, cancel, context=context)
        return Job(f"s{next(self._ids)}", prompt, params, seed, limit, cancel, request.priority, context,
                   request.play_at, request.listener)  # fmt: skip

    def _prompt(self, request: SynthesisRequest, design: bool) -> tuple[Prompt | PromptPlan, DecoderState | None]:
        """The talker prompt for a request, and the codec state to continue from (clones): a
        plan of ids where the runner can embed it (no GPU work here), else the embeddings."""
        language = _LANGUAGES.get(request.language or "", request.language)
        if self.clones is not None:
            voice = self.clones.get(request.voice)
            if self._prompt_stream is not None:  # a voice removed meanwhile keeps its memory until read
                for t in (voice.speaker_embedding, voice.ref_codes):
                    if t is not None:
                        t.record_stream(self._prompt_stream)
            prompt = self.prompts.build(
                request.text,
                speaker_embedding=voice.speaker_embedding,
                ref_codes=voice.ref_codes,
                ref_text=voice.ref_text,
                language=language,
                stream_text=True,
            )
            return prompt, voice.decoder_context
        # The 0.6B CustomVoice model was not trained on instructions; the reference drops them too.
        instruct = None if self.ck.config.model_size == "0b6" else request.instructions
        speaker = None if design else request.voice
        if self._plans:
            return self.prompts.plan(request.text, speaker=speaker, language=language, instruct=instruct), None
        return self.prompts.build(request.text, speaker=speaker, language=language, instruct=instruct), None

    @property
    def opens_at_once(self) -> bool:  # type: ignore[override]
        """A stream opens with its prompt as token ids and a put on the runner's queue (no GPU
        work: the runner embeds it), where the runner has a text table and voices are not clones."""
        return self._plans and self.clones is None

    @property
    def _plans(self) -> bool:
        """Whether prompts go to the runner as plans of ids (it has a text table)."""
        return self.runner is not None and self.runner.decoder.text_table is not None

    @contextlib.contextmanager
    def _prompt_stream_context(self) -> Iterator[None]:
        """On a GPU, requests build their prompts on a side stream: the host-to-device copies
        of token ids then wait for nothing but themselves, not for the decode steps queued on
        the main stream (which would add a step's time per copy to the TTFA)."""
        if self._prompt_stream is None:
            yield
            return
        with torch.cuda.stream(self._prompt_stream):
            yield
        self._prompt_stream.synchronize()

    def _frames(
        self,
        prompt: Prompt | PromptPlan,
        params: SamplingParams,
        limit: int,
        cancel: CancelToken,
        request: SynthesisRequest | None = None,
        context: DecoderState | None = None,
    ) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """PCM as it is made: per frame from the runner, or per packet eagerly, one stream at a
        time; each with its 16-bit PCM where the runner made it (`pcm16_step`), else None."""
        self._streams_served += 1
        if self.runner is None:
            with self._lock:
                state = context.copy() if context is not None else DecoderState()
                packet: list[torch.Tensor] = []
                for frame in generate_codes(self.ck.talker, prompt, params, cancel, limit):
                    packet.append(frame)
                    if len(packet) == self.packet_frames:
                        yield (
                            self.ck.codec.decode(torch.stack(packet, dim=1)[None], state)[0].float().cpu().numpy(),
                            None,
                        )
                        packet = []
                if packet and not cancel.cancelled:
                    yield self.ck.codec.decode(torch.stack(packet, dim=1)[None], state)[0].float().cpu().numpy(), None
            return
        job = self._job(prompt, params, limit, cancel, request, context)
        self.runner.submit(job)  # Busy when the queue is full
        try:
            while True:
                try:  # the runner ends a cancelled job within a step; the timeout is only a safety net
                    item = job.frames.get(timeout=0.1)
                except queue.Empty:
                    if cancel.cancelled:
                        return
                    continue
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.closed = True  # the runner frees the row at its next step

    def _chunks(
        self, pieces: Iterator[tuple[np.ndarray, np.ndarray | None]], cancel: CancelToken
    ) -> Iterator[AudioChunk]:
        """One chunk per `packet_frames` frames of PCM (the last one may be shorter)."""
        packets = Packets(self.packet_frames * self.ck.codec.config.samples_per_frame)
        for frame in pieces:
            if (chunk := packets.add(frame)) is not None:
                yield chunk
            if cancel.cancelled:
                return
        if (last := packets.rest()) is not None:
            yield last

    def close(self) -> None:
        if self._prompt_thread is not None:
            self._prompt_thread.close()
        if self.runner is not None:
            self.runner.close()


class PolledFrames:
    """A runner job's chunks for a reader that must not block (an event loop, woken by the
    job's `wake`): `poll()` takes what the runner has handed out so far, as whole packets."""

    def __init__(self, job: Job, packet_samples: int) -> None:
        self.job, self._packets = job, Packets(packet_samples)
        self._failure: BaseException | None = None
        self.ended = False

    def poll(self) -> list[AudioChunk]:
        """The chunks ready now (`ended` once the job's last came); an engine failure raises,
        after the chunks made before it were taken."""
        if self._failure is not None:
            self.ended = True
            raise self._failure
        out: list[AudioChunk] = []
        while not self.ended:
            try:
                item = self.job.frames.get_nowait()
            except queue.Empty:
                break
            if item is END:
                self.ended = True
                last = self._packets.rest()
                if last is not None and not self.job.cancel.cancelled:
                    out.append(last)
                break
            if isinstance(item, BaseException):
                if out:  # the audio made so far first; the failure on the next poll
                    self._failure = item
                    break
                self.ended = True
                raise item
            if (chunk := self._packets.add(item)) is not None:
                out.append(with_marks(chunk, self.job))
        return out

    def close(self) -> None:
        """The reader is done: the runner frees the row at its next step."""
        self.job.closed = True


def with_marks(chunk: AudioChunk, job: Job) -> AudioChunk:
    """A stream's first chunk with its job's clock readings (`AudioChunk.marks`) and how its
    first step was made up (the streams prefilled with it, the streams stepped with it: how a
    burst was grouped); later chunks as they are."""
    if chunk.seq != 0 or job.started_at is None or job.first_step_at is None or job.first_frame_at is None:
        return chunk
    marks = {"submitted": job.submitted_at, "prefill": job.started_at, "first_step": job.first_step_at,
             "first_frame": job.first_frame_at, "admitted_with": float(job.admitted_with),
             "first_step_rows": float(job.first_step_rows)}  # fmt: skip
    return replace(chunk, marks=marks)


class Packets:
    """One stream's frames `(pcm, pcm16)` as chunks of at least `size` samples, numbered in
    order; `rest()` is the shorter last one. The frames' 16-bit PCM is joined too when every
    frame of a chunk has it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._held: list[tuple[np.ndarray, np.ndarray | None]] = []
        self._samples, self._seq = 0, 0

    def add(self, frame: tuple[np.ndarray, np.ndarray | None]) -> AudioChunk | None:
        self._held.append(frame)
        self._samples += len(frame[0])
        return self.rest() if self._samples >= self.size else None

    def rest(self) -> AudioChunk | None:
        frames = self._held
        if not frames:
            return None
        if len(frames) == 1:
            pcm, pcm16 = frames[0]
        else:
            pcm = np.concatenate([f for f, _ in frames])
            parts = [p for _, p in frames if p is not None]
            pcm16 = np.concatenate(parts) if len(parts) == len(frames) else None
        chunk = AudioChunk(pcm, SAMPLE_RATE, self._seq, t_ready=time.perf_counter(), pcm16=pcm16)
        self._held, self._samples, self._seq = [], 0, self._seq + 1
        return chunk


def create(settings: Settings) -> Qwen3Engine:
    model = settings.qwen3_model or settings.qwen3_model_dir  # Settings refuses two that disagree
    if model is None:
        raise EngineFailure(
            "set VOXGATE_QWEN3_MODEL to a Qwen3-TTS checkpoint, a Hugging Face id (e.g. "
            "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice) or a directory (VOXGATE_QWEN3_MODEL_DIR also takes a directory)"
        )
    model_dir = resolve_model(model, settings.qwen3_revision)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[settings.qwen3_dtype]
    checkpoint = load_checkpoint(
        model_dir,
        settings.qwen3_device,
        dtype,
        fused_kernels=settings.qwen3_fused_kernels,
        codec_lean=settings.qwen3_codec_lean,
    )
    return Qwen3Engine(
        checkpoint,
        settings.qwen3_packet_frames,
        cuda_graphs=settings.qwen3_cuda_graphs,
        compile_graphs=settings.qwen3_compile,
        batched=settings.qwen3_batched,
        max_streams=settings.qwen3_max_streams,
        max_waiting=settings.qwen3_max_waiting,
        kv_capacity=settings.qwen3_kv_capacity,
        prompt_thread=settings.qwen3_prompt_thread,
        text_table=settings.qwen3_text_table,
        lead_ms=settings.qwen3_lead_ms,
        pcm16_step=settings.qwen3_pcm16_step,
        trace_steps=settings.qwen3_trace_steps,
    )
