"""Qwen3-TTS configuration, read from the official `config.json` / `generation_config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A checkpoint directory in the official layout: what the loader reads (and a hub download fetches).
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/model.safetensors",
)

MODELS = (  # the official checkpoints `make-random-checkpoint` can imitate
    "Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Qwen3-TTS-12Hz-1.7B-Base",
    "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
)


@dataclass(frozen=True, slots=True)
class StackConfig:
    """One Qwen3 decoder stack (the talker's or the code predictor's)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StackConfig:
        return cls(**{f: raw[f] for f in cls.__dataclass_fields__ if f in raw})


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    stack: StackConfig
    predictor: StackConfig
    vocab_size: int  # codec vocabulary of the talker (codebook-0 codes + control ids)
    predictor_vocab_size: int  # per codebook 1..15
    num_code_groups: int
    text_vocab_size: int
    text_hidden_size: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    language_ids: dict[str, int] = field(default_factory=dict)
    speaker_ids: dict[str, int] = field(default_factory=dict)
    speaker_dialects: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Qwen3TTSConfig:
    talker: TalkerConfig
    model_type: str  # custom_voice | base | voice_design
    model_size: str  # 0b6 | 1b7
    tts_bos_id: int
    tts_eos_id: int
    tts_pad_id: int
    speaker_encoder: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Qwen3TTSConfig:
        t = raw["talker_config"]
        p = t["code_predictor_config"]
        talker = TalkerConfig(
            stack=StackConfig.from_dict(t),
            predictor=StackConfig.from_dict(p),
            vocab_size=t["vocab_size"],
            predictor_vocab_size=p["vocab_size"],
            num_code_groups=t["num_code_groups"],
            text_vocab_size=t["text_vocab_size"],
            text_hidden_size=t["text_hidden_size"],
            codec_pad_id=t["codec_pad_id"],
            codec_bos_id=t["codec_bos_id"],
            codec_eos_id=t["codec_eos_token_id"],
            codec_think_id=t["codec_think_id"],
            codec_nothink_id=t["codec_nothink_id"],
            codec_think_bos_id=t["codec_think_bos_id"],
            codec_think_eos_id=t["codec_think_eos_id"],
            language_ids=dict(t.get("codec_language_id") or {}),
            speaker_ids=dict(t.get("spk_id") or {}),
            speaker_dialects={k: v for k, v in (t.get("spk_is_dialect") or {}).items() if v},
        )
        return cls(
            talker=talker,
            model_type=raw["tts_model_type"],
            model_size=raw["tts_model_size"],
            tts_bos_id=raw["tts_bos_token_id"],
            tts_eos_id=raw["tts_eos_token_id"],
            tts_pad_id=raw["tts_pad_token_id"],
            speaker_encoder=dict(raw.get("speaker_encoder_config") or {}),
        )

    @classmethod
    def load(cls, model_dir: Path) -> Qwen3TTSConfig:
        return cls.from_dict(json.loads((model_dir / "config.json").read_text()))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick codes: greedy when `do_sample` is False. Talker and code predictor
    ("subtalker") have separate settings; defaults come from generation_config.json."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    min_new_tokens: int = 2
    max_new_tokens: int = 8192
    seed: int | None = None

    @classmethod
    def from_generation_config(cls, raw: dict[str, Any], **overrides: Any) -> SamplingParams:
        names = {
            "do_sample": "do_sample",
            "temperature": "temperature",
            "top_k": "top_k",
            "top_p": "top_p",
            "repetition_penalty": "repetition_penalty",
            "subtalker_dosample": "subtalker_do_sample",
            "subtalker_temperature": "subtalker_temperature",
            "subtalker_top_k": "subtalker_top_k",
            "subtalker_top_p": "subtalker_top_p",
            "max_new_tokens": "max_new_tokens",
        }
        values = {ours: raw[theirs] for theirs, ours in names.items() if theirs in raw}
        values.update(overrides)
        return cls(**values)

    @classmethod
    def greedy(cls, **overrides: Any) -> SamplingParams:
        return cls(do_sample=False, subtalker_do_sample=False, **overrides)
