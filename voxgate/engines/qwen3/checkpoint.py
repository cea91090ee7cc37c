"""`voxgate make-random-checkpoint`: random-weight checkpoints in the official layout.

Built from the real configs and tokenizer files, so architecture and shapes are real and
only the values are random. Every parameter is random and non-zero (so parity cannot pass
by accident), scaled so activations stay in range and the codec output is not clipped.
`tiny=True` shrinks layers and widths for fast CPU tests, keeping vocabularies, special
ids, head_dim 128 of the talker (the reference's MRoPE sections need it), rates and windows.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from voxgate.engines.qwen3.codec import CodecDecoder, CodecDecoderConfig
from voxgate.engines.qwen3.codec_encoder import CodecEncoder, CodecEncoderConfig
from voxgate.engines.qwen3.config import MODELS, Qwen3TTSConfig
from voxgate.engines.qwen3.speaker import SpeakerEncoder, SpeakerEncoderConfig
from voxgate.engines.qwen3.talker import Talker

log = logging.getLogger(__name__)
TINY_TALKER = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 128, "text_hidden_size": 64}  # fmt: skip
TINY_PREDICTOR = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 32, "layer_types": ["full_attention"] * 2}  # fmt: skip
TINY_SPEAKER = {"enc_dim": 128, "enc_channels": [32, 32, 32, 32, 96], "enc_attention_channels": 16,
                "enc_se_channels": 16}  # fmt: skip
TINY_ENCODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 2, "head_dim": 16, "num_filters": 4, "codebook_dim": 16,
                "vector_quantization_hidden_dimension": 16, "upsample_groups": 32}  # fmt: skip
TINY_CODEC = {"codebook_dim": 64, "latent_dim": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32, "decoder_dim": 512}  # fmt: skip


def default_config_root() -> Path:
    """`../shared/qwen3-tts` beside the repository (where the official configs live)."""
    return Path(__file__).resolve().parents[4] / "shared" / "qwen3-tts"


def randomise(
    module: nn.Module, generator: torch.Generator, quiet: tuple[str, ...] = (), layer_scale: float = 0.1
) -> None:
    """Every persistent tensor (parameters and codebook buffers) random and non-zero, scaled
    by role so signals neither vanish nor blow up; names containing a `quiet` part get 0.3x."""
    with torch.no_grad():
        for name, t in module.state_dict().items():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "initialized":
                value = torch.ones(t.shape)
            elif leaf == "cluster_usage":
                value = torch.rand(t.shape, generator=generator) + 0.5
            elif leaf in ("embedding_sum", "embed_sum") or isinstance(_owner(module, name), nn.Embedding):
                value = torch.randn(t.shape, generator=generator)
            elif "norm" in name and leaf == "weight" and t.dim() == 1:
                value = 1 + 0.1 * torch.randn(t.shape, generator=generator)
            elif leaf in ("scale", "gamma"):
                value = layer_scale + 0.2 * layer_scale * torch.randn(t.shape, generator=generator)
            elif t.dim() == 1:  # biases, snake alpha/beta
                value = (0.1 if leaf in ("alpha", "beta") else 0.02) * torch.randn(t.shape, generator=generator)
            else:
                transposed = isinstance(_owner(module, name), nn.ConvTranspose1d)
                fan_in = t.shape[0] if transposed else t[0].numel()
                value = torch.randn(t.shape, generator=generator) / fan_in**0.5
                if any(q in name for q in quiet):
                    value *= 0.3
            value[value == 0] = 1e-3
            t.copy_(value.to(t.dtype))


def _owner(module: nn.Module, name: str) -> nn.Module:
    return module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module


def make_random_checkpoint(
    model: str, out: Path, tiny: bool = False, seed: int = 0, config_root: Path | None = None
) -> Path:
    root = config_root or default_config_root()
    src = root / model
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"no config for {model!r} under {root}; models: {', '.join(MODELS)}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "speech_tokenizer").mkdir(exist_ok=True)
    for name in ("generation_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out / name)
    shutil.copyfile(
        src / "speech_tokenizer/preprocessor_config.json", out / "speech_tokenizer/preprocessor_config.json"
    )
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(root / "tokenizer" / name, out / name)
    raw = json.loads((src / "config.json").read_text())
    codec_raw = json.loads((src / "speech_tokenizer/config.json").read_text())
    if tiny:
        raw["talker_config"].update(TINY_TALKER)
        raw["talker_config"]["code_predictor_config"].update(TINY_PREDICTOR)
        if raw.get("speaker_encoder_config"):
            raw["speaker_encoder_config"].update(TINY_SPEAKER)
        codec_raw["decoder_config"].update(TINY_CODEC)
        codec_raw["encoder_config"].update(TINY_ENCODER)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    (out / "speech_tokenizer/config.json").write_text(json.dumps(codec_raw, indent=2))

    generator = torch.Generator().manual_seed(seed)
    config = Qwen3TTSConfig.from_dict(raw)
    talker = Talker(config.talker)
    randomise(talker, generator)
    state = {f"talker.{k}": v.contiguous() for k, v in talker.state_dict().items()}
    if config.model_type == "base":
        speaker = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config.speaker_encoder))
        randomise(speaker, generator)
        state.update({f"speaker_encoder.{k}": v.contiguous() for k, v in speaker.state_dict().items()})
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del talker, state
    codec = CodecDecoder(CodecDecoderConfig.from_dict(codec_raw["decoder_config"]))
    randomise(codec, generator, quiet=(".conv1.", ".conv2.", "block.1.conv"))  # keeps the wav unclipped
    codec_state = {f"decoder.{k}": v.contiguous() for k, v in codec.state_dict().items()}
    encoder = CodecEncoder(CodecEncoderConfig.from_dict(codec_raw["encoder_config"]))
    randomise(encoder, generator, layer_scale=0.5)  # large enough that attention visibly matters
    codec_state.update({f"encoder.{k}": v.contiguous() for k, v in encoder.state_dict().items()})
    save_file(codec_state, str(out / "speech_tokenizer/model.safetensors"), metadata={"format": "pt"})
    log.info("wrote random %s%s checkpoint to %s", model, " (tiny)" if tiny else "", out)
    return out
