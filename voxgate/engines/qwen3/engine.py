"""The `qwen3` engine: prompt -> codes frame by frame -> incremental codec decode -> PCM.

One packet of `packet_frames` frames is decoded as soon as it is generated, with the
decoder's state carried across packets, so audio starts after the first frame and nothing
is ever re-decoded. Voices are the checkpoint's speakers (CustomVoice) or one `design`
voice whose description comes from the request's `instructions` (VoiceDesign).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from voxgate.audio import resample
from voxgate.engines.qwen3.codec import DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.generate import generate_codes, max_frames_for
from voxgate.engines.qwen3.graphs import StaticCodecStep, StaticDecoder
from voxgate.engines.qwen3.loader import Qwen3Checkpoint, load_checkpoint
from voxgate.engines.qwen3.prompt import PromptBuilder
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


class Qwen3Engine:
    name = "qwen3"
    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        checkpoint: Qwen3Checkpoint,
        packet_frames: int = 1,
        sampling: SamplingParams | None = None,
        cuda_graphs: bool = True,
        compile_graphs: bool = False,
    ):
        if packet_frames < 1:
            raise ValueError("packet_frames must be >= 1")
        self.ck = checkpoint
        self.packet_frames = packet_frames
        self.sampling = sampling or SamplingParams.from_generation_config(checkpoint.generation)
        self.prompts = PromptBuilder(checkpoint.config, checkpoint.tokenizer, checkpoint.talker)
        # On a GPU the decode loop runs through fixed-shape CUDA graphs captured here, at start-up.
        self.static: StaticDecoder | None = None
        self.codec_step: StaticCodecStep | None = None
        on_gpu = checkpoint.talker.codec_head.weight.device.type == "cuda"
        self.eager_reason = "cpu" if not on_gpu else "disabled" if not cuda_graphs else None
        if on_gpu and cuda_graphs and min(self.sampling.top_p, self.sampling.subtalker_top_p) < 1.0:
            self.eager_reason = "top_p"
            log.warning("top_p < 1 is not in the captured sampler yet: decoding eagerly")
        elif on_gpu and cuda_graphs:
            self.static = StaticDecoder(checkpoint.talker, self.sampling, compile_bodies=compile_graphs)
            self.codec_step = StaticCodecStep(checkpoint.codec, packet_frames)
        self._lock = threading.Lock()  # one stream at a time until the batched runner lands (issue 4)
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

    def counters(self) -> dict[str, dict[str, float]]:
        """Numbers for /metrics: graph use, replays, and eager fallbacks by reason."""
        fallbacks: dict[str, float] = {}
        replays = {"talker_and_code_predictor": 0.0, "codec_decoder": 0.0}
        if self.static is not None and self.codec_step is not None:
            replays = {
                "talker_and_code_predictor": float(self.static.stats.replays),
                "codec_decoder": float(self.codec_step.stats.replays),
            }
            fallbacks.update({k: float(v) for k, v in self.codec_step.stats.eager_fallbacks.items()})
        if self.eager_reason is not None:
            fallbacks[f"no_graphs_{self.eager_reason}"] = float(self._streams_served)
        return {"graph_replays": replays, "eager_fallbacks": fallbacks}

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
        frames = generate_codes(self.ck.talker, prompt, self.sampling, CancelToken(), max_new_tokens=4)
        for _ in self._decode_packets(frames, CancelToken()):
            pass

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        language = _LANGUAGES.get(request.language or "", request.language)
        design = self.ck.config.model_type == "voice_design"
        if design and not request.instructions:
            raise InvalidRequest("a VoiceDesign model needs `instructions` describing the voice")
        if request.speed != 1.0:
            raise NotSupported("the qwen3 engine speaks at its own pace; speed must be 1.0")
        # The 0.6B CustomVoice model was not trained on instructions; the reference drops them too.
        instruct = None if self.ck.config.model_size == "0b6" else request.instructions
        context = None
        if self.clones is not None:
            voice = self.clones.get(request.voice)
            context = voice.decoder_context
            prompt = self.prompts.build(
                request.text,
                speaker_embedding=voice.speaker_embedding,
                ref_codes=voice.ref_codes,
                ref_text=voice.ref_text,
                language=language,
                stream_text=True,
            )
        else:
            prompt = self.prompts.build(
                request.text,
                speaker=None if design else request.voice,
                language=language,
                instruct=instruct,
            )
        params = self.sampling if request.seed is None else replace(self.sampling, seed=request.seed)
        limit = max_frames_for(prompt.text_tokens, params)
        if self.static is not None:
            room = self.static.capacity - prompt.embeds.shape[1] - 1
            if room < 64:
                raise TextTooLong("the text is too long for the decoder's KV cache; split it into sentences")
            if room < limit:
                log.info("frame limit %d cut to %d by the KV cache", limit, room)
                limit = room
        with self._lock:
            self._streams_served += 1
            if self.static is not None:
                frames = self.static.generate(prompt, cancel, limit, request.seed)
            else:
                frames = generate_codes(self.ck.talker, prompt, params, cancel, limit)
            yield from self._decode_packets(frames, cancel, context)

    def _decode_packets(
        self, frames: Iterator[torch.Tensor], cancel: CancelToken, context: DecoderState | None = None
    ) -> Iterator[AudioChunk]:
        state = context.copy() if context is not None else DecoderState()
        if self.codec_step is not None:
            self.codec_step.reset(context)
        packet: list[torch.Tensor] = []
        seq = 0
        for frame in frames:
            packet.append(frame)
            if len(packet) == self.packet_frames:
                yield self._chunk(packet, state, seq)
                packet, seq = [], seq + 1
            if cancel.cancelled:
                return
        if packet:
            yield self._chunk(packet, state, seq)

    def _chunk(self, packet: list[torch.Tensor], state: DecoderState, seq: int) -> AudioChunk:
        codes = torch.stack(packet, dim=1)[None]  # (1, 16, P)
        if self.codec_step is not None:
            pcm = self.codec_step.decode(codes)[0].float().cpu().numpy()
        else:
            pcm = self.ck.codec.decode(codes, state)[0].float().cpu().numpy()
        return AudioChunk(pcm, SAMPLE_RATE, seq, t_ready=time.perf_counter())

    def close(self) -> None:
        return None


def create(settings: Settings) -> Qwen3Engine:
    if settings.qwen3_model_dir is None:
        raise EngineFailure("set VOXGATE_QWEN3_MODEL_DIR to a Qwen3-TTS checkpoint directory")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[settings.qwen3_dtype]
    checkpoint = load_checkpoint(Path(settings.qwen3_model_dir), settings.qwen3_device, dtype)
    return Qwen3Engine(
        checkpoint,
        settings.qwen3_packet_frames,
        cuda_graphs=settings.qwen3_cuda_graphs,
        compile_graphs=settings.qwen3_compile,
    )
