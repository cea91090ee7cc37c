"""Loading a Qwen3-TTS checkpoint in the official directory layout."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

from voxgate.engines.qwen3 import kernels
from voxgate.engines.qwen3.codec import CodecDecoder, CodecDecoderConfig
from voxgate.engines.qwen3.codec_encoder import CodecEncoder, CodecEncoderConfig
from voxgate.engines.qwen3.config import CHECKPOINT_FILES, Qwen3TTSConfig
from voxgate.engines.qwen3.prompt import load_text_tokenizer
from voxgate.engines.qwen3.speaker import SpeakerEncoder, SpeakerEncoderConfig
from voxgate.engines.qwen3.talker import Talker
from voxgate.types import VoxgateError

log = logging.getLogger(__name__)

REQUIRED_FILES = CHECKPOINT_FILES


class CheckpointError(VoxgateError):
    """A model directory that is missing files, has the wrong layout or mismatched weights."""

    code = "checkpoint_error"
    status = 500


@dataclass
class Qwen3Checkpoint:
    config: Qwen3TTSConfig
    generation: dict
    talker: Talker
    codec: CodecDecoder
    tokenizer: Tokenizer
    model_dir: Path
    speaker: SpeakerEncoder | None = None  # Base (voice clone) models only
    encoder: CodecEncoder | None = None  # audio -> reference codes (Base models with an encoder)


def check_layout(model_dir: Path) -> None:
    if not model_dir.is_dir():
        raise CheckpointError(f"model directory {model_dir} does not exist")
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise CheckpointError(f"{model_dir} is not a Qwen3-TTS 12 Hz checkpoint: missing {', '.join(missing)}")


def load_weights(module: nn.Module, state: dict[str, torch.Tensor], prefix: str, ignore: tuple[str, ...] = ()) -> None:
    """Copy `prefix`-ed tensors into `module`, reporting missing, unexpected and misshaped ones."""
    own = module.state_dict()
    given = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    missing = sorted(set(own) - set(given))
    unexpected = sorted(k for k in set(given) - set(own) if not k.startswith(ignore))
    misshaped = [
        f"{k}: {tuple(given[k].shape)} != {tuple(own[k].shape)}"
        for k in own
        if k in given and given[k].shape != own[k].shape
    ]
    if missing or unexpected or misshaped:
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
            if items:
                parts.append(f"{label}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''} ({len(items)})")
        raise CheckpointError(f"weights under {prefix!r} do not match the config: " + "; ".join(parts))
    module.load_state_dict({k: given[k] for k in own}, strict=True)


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except Exception as exc:  # safetensors reports corrupt files with its own error type
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def load_checkpoint(
    model_dir: Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    fused_kernels: bool = True,
    codec_lean: bool = False,
) -> Qwen3Checkpoint:
    """Weights onto `device`; on a GPU with the fast paths (`fuse()`), and the Triton kernels
    when `fused_kernels` and Triton is there; the codec decoder's lean path with `codec_lean`."""
    model_dir = Path(model_dir)
    check_layout(model_dir)
    t0 = time.perf_counter()
    try:
        config = Qwen3TTSConfig.load(model_dir)
        codec_cfg = CodecDecoderConfig.from_dict(
            json.loads((model_dir / "speech_tokenizer/config.json").read_text())["decoder_config"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"unreadable config in {model_dir}: {exc}") from exc
    talker, codec = Talker(config.talker), CodecDecoder(codec_cfg)
    weights = _read_safetensors(model_dir / "model.safetensors")
    load_weights(talker, weights, "talker.")
    speaker = None
    if config.model_type == "base":
        speaker = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config.speaker_encoder))
        load_weights(speaker, weights, "speaker_encoder.")
        speaker.to(device=device, dtype=dtype).eval()
    del weights
    codec_weights = _read_safetensors(model_dir / "speech_tokenizer/model.safetensors")
    load_weights(codec, codec_weights, "decoder.")
    encoder = None
    if speaker is not None and any(k.startswith("encoder.") for k in codec_weights):
        raw = json.loads((model_dir / "speech_tokenizer/config.json").read_text())
        encoder = CodecEncoder(CodecEncoderConfig.from_dict(raw["encoder_config"]))
        load_weights(encoder, codec_weights, "encoder.")
        encoder.to(device=device).eval()  # fp32 always: in bf16 the nearest codebook entries drift
    del codec_weights
    talker.to(device=device, dtype=dtype).eval()
    codec.to(device=device, dtype=dtype).eval()
    codec.refresh()
    codec.set_lean(codec_lean)
    if talker.codec_head.weight.is_cuda:
        use_kernels = fused_kernels and kernels.available()
        talker.fuse(kernels=use_kernels)
        codec.fuse(kernels=use_kernels)
    try:
        tokenizer = load_text_tokenizer(model_dir)
        generation = json.loads((model_dir / "generation_config.json").read_text())
    except Exception as exc:  # tokenizers and json raise their own error types
        raise CheckpointError(f"unreadable tokenizer or generation config in {model_dir}: {exc}") from exc
    log.info(
        "loaded %s (%s, %s) in %.1f s", model_dir.name, config.model_type, config.model_size, time.perf_counter() - t0
    )
    return Qwen3Checkpoint(config, generation, talker, codec, tokenizer, model_dir, speaker, encoder)
