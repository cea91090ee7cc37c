"""The 12 Hz codec encoder (24 kHz waveform -> codes), for voice-clone reference audio.

This is Kyutai's Mimi encoder as Qwen3-TTS ships it: a causal SEANet conv stack (24 kHz ->
25 Hz), a causal transformer, a stride-2 conv (25 -> 12.5 Hz) and a split residual vector
quantizer, of which the first 16 codebooks are kept. It runs once per reference clip, so it
is written for exact parity with the official encoder rather than for speed: every op is the
same PyTorch op on the same shapes as in `transformers.MimiModel`, which makes the codes
equal bit for bit on the CPU (a nearest-neighbour search flips on any difference in a near tie).

Parameter and buffer names match the official `speech_tokenizer/model.safetensors` with the
`encoder.` prefix removed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_DOWNSAMPLE_STRIDE = 2  # Mimi's 25 Hz -> 12.5 Hz conv; fixed in MimiModel, not in the config


@dataclass(frozen=True, slots=True)
class CodecEncoderConfig:
    """The `encoder_config` of `speech_tokenizer/config.json` (a Mimi config), plus how many
    codebooks the codec keeps (`encoder_valid_num_quantizers` of the top-level config)."""

    sampling_rate: int = 24000
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)  # applied reversed (4, 5, 6, 8) when encoding
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    compress: int = 2
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    frame_rate: float = 12.5
    valid_num_quantizers: int = 16

    @classmethod
    def from_dict(cls, raw: dict[str, Any], **overrides: Any) -> CodecEncoderConfig:
        """Parse a Mimi `encoder_config` dict; `overrides` (e.g. `valid_num_quantizers`) win.

        Raises ValueError for Mimi variants no Qwen3-TTS checkpoint uses (non-causal convs,
        conv shortcuts, reflect padding, stereo, another activation), rather than encoding wrongly.
        """
        required = {
            "use_causal_conv": True,
            "use_conv_shortcut": False,
            "pad_mode": "constant",
            "audio_channels": 1,
            "hidden_act": "gelu",
        }
        for key, expected in required.items():
            if key in raw and raw[key] != expected:
                raise ValueError(f"codec encoder: {key}={raw[key]!r} is not supported (only {expected!r})")
        names = {f.name for f in fields(cls)}
        known: dict[str, Any] = {k: v for k, v in raw.items() if k in names and v is not None}
        if "upsampling_ratios" in known:
            known["upsampling_ratios"] = tuple(known["upsampling_ratios"])
        # Transformers 4.x writes `rope_theta`, 5.x nests it in `rope_parameters`.
        theta = raw.get("rope_theta") or (raw.get("rope_parameters") or {}).get("rope_theta")
        if theta is not None:
            known["rope_theta"] = float(theta)
        if raw.get("head_dim") is None and "hidden_size" in raw:
            known["head_dim"] = raw["hidden_size"] // raw.get("num_attention_heads", cls.num_attention_heads)
        if raw.get("codebook_dim") is None and "hidden_size" in raw:
            known["codebook_dim"] = raw["hidden_size"]  # MimiConfig's default
        rate = raw.get("_frame_rate", raw.get("frame_rate"))
        if rate is not None:
            known["frame_rate"] = float(rate)
        known.update(overrides)
        return cls(**known)

    def __post_init__(self) -> None:
        if self.sampling_rate / self.samples_per_frame != self.frame_rate:
            raise ValueError(
                f"codec encoder: frame_rate {self.frame_rate} != {self.sampling_rate}/{self.samples_per_frame}"
            )
        if not self.num_semantic_quantizers <= self.valid_num_quantizers <= self.num_quantizers:
            raise ValueError(
                f"codec encoder: cannot keep {self.valid_num_quantizers} of {self.num_quantizers} codebooks"
            )
        if self.codebook_dim != self.vector_quantization_hidden_dimension:
            raise ValueError("codec encoder: codebook_dim must equal vector_quantization_hidden_dimension")

    @property
    def hop_length(self) -> int:
        """Samples per step of the conv stack (960 at 25 Hz)."""
        return math.prod(self.upsampling_ratios)

    @property
    def samples_per_frame(self) -> int:
        """Samples per output frame (1920 at 12.5 Hz)."""
        return self.hop_length * _DOWNSAMPLE_STRIDE

    @property
    def downsample_kernel(self) -> int:
        """Kernel of the 25 Hz -> 12.5 Hz conv (4), computed as MimiModel does."""
        encodec_rate = math.ceil(self.sampling_rate / self.hop_length)
        return 2 * int(encodec_rate / self.frame_rate)


class _CausalConv(nn.Module):
    """Mimi's causal conv: left-pad by kernel - stride, right-pad up to a whole stride, so an
    input of L samples gives ceil(L / stride) outputs and no output sees the future."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias)
        self.stride, self.pad_mode = stride, pad_mode
        self.left = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        right = -length % self.stride
        return self.conv(F.pad(x, (self.left, right), mode=self.pad_mode))


class _ResidualBlock(nn.Module):
    """SEANet residual unit: x + conv1x1(elu(conv_k(elu(x)))), the inner width halved by `compress`.
    The ELUs sit in `block` (indices 0 and 2) so the convs keep Mimi's names `block.1`, `block.3`."""

    def __init__(self, cfg: CodecEncoderConfig, dim: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.ModuleList(
            [
                nn.ELU(),
                _CausalConv(dim, hidden, cfg.residual_kernel_size, dilation=dilation),
                nn.ELU(),
                _CausalConv(hidden, dim, 1),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class _SEANetEncoder(nn.Module):
    """(B, 1, L) -> (B, hidden, ceil(L / hop)). Layer indices follow Mimi, ELUs included."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [_CausalConv(1, cfg.num_filters, cfg.kernel_size)]
        channels = cfg.num_filters
        for ratio in reversed(cfg.upsampling_ratios):
            for j in range(cfg.num_residual_layers):
                layers.append(_ResidualBlock(cfg, channels, cfg.dilation_growth_rate**j))
            layers += [nn.ELU(), _CausalConv(channels, channels * 2, 2 * ratio, stride=ratio)]
            channels *= 2
        layers += [nn.ELU(), _CausalConv(channels, cfg.hidden_size, cfg.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class _Attention(nn.Module):
    """Full causal self-attention with RoPE. Config `sliding_window` (250) is ignored on
    purpose: the official package forces full attention, as Transformers 4.57 computed it."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(heads * d, cfg.hidden_size, bias=cfg.attention_bias)
        self.heads, self.kv_heads, self.head_dim = heads, kv, d
        self.scaling = 1 / math.sqrt(d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        # Written out like Transformers' eager attention (not SDPA) so the scores round the
        # same way; the sequences are short (25 per second of reference audio).
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(b, t, -1))


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotary embedding; x (B, H, T, D), cos/sin (T, D)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class _MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn_layer_scale = _LayerScale(cfg.hidden_size)
        self.mlp_layer_scale = _LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class _Transformer(nn.Module):
    """(B, T, hidden) -> (B, T, hidden); pre-norm layers and no final norm, as in Mimi."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.head_dim, self.theta = cfg.head_dim, cfg.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        # RoPE tables in float32 whatever the model dtype, then cast, as Transformers does.
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=x.device) / self.head_dim
        inv_freq = 1.0 / (self.theta**exponents)
        freqs = torch.arange(t, dtype=torch.float32, device=x.device)[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        for layer in self.layers:
            x = layer(x, cos, sin, future)
        return x


class _Codebook(nn.Module):
    """Mimi keeps codebooks as buffers (EMA-trained): centroid = embed_sum / cluster_usage."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def centroids(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = _Codebook(size, dim)


class _ResidualVQ(nn.Module):
    """Residual VQ with its own projection in (and out, unused by encoding, kept for the weights)."""

    def __init__(self, cfg: CodecEncoderConfig, n: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(cfg.codebook_size, cfg.codebook_dim) for _ in range(n))
        # Mimi projects into the quantizers' width only when it differs from hidden_size.
        dim = cfg.vector_quantization_hidden_dimension
        self.input_proj: nn.Conv1d | None = None
        self.output_proj: nn.Conv1d | None = None
        if dim != cfg.hidden_size:
            self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
            self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """x (B, hidden, T) -> codes (B, n, T) from the first n quantizers."""
        if self.input_proj is not None:
            x = self.input_proj(x)  # a k=1 conv, not a linear: the same kernel as the reference
        b, d, t = x.shape
        residual = x.transpose(1, 2)  # (B, T, D)
        codes = []
        for layer in self.layers[:n]:
            table = layer.codebook.centroids()
            # torch.cdist exactly as the reference calls it (float32, one flat batch of rows):
            # its matmul-based distances round differently from a hand-written ||x - e||.
            dists = torch.cdist(residual.reshape(1, b * t, d).float(), table[None].float(), p=2)[0]
            index = dists.argmin(dim=-1).view(b, t)
            residual = residual - F.embedding(index, table)
            codes.append(index)
        return torch.stack(codes, dim=1)


class _SplitResidualVQ(nn.Module):
    """A semantic RVQ (codebook 0) and an acoustic RVQ (the rest), both fed the same input:
    the acoustic one never sees the semantic residual."""

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.num_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = _ResidualVQ(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = _ResidualVQ(cfg, cfg.num_quantizers - cfg.num_semantic_quantizers)

    def encode(self, x: torch.Tensor, n: int) -> torch.Tensor:
        codes = self.semantic_residual_vector_quantizer.encode(x, self.num_semantic)
        if n == self.num_semantic:
            return codes
        acoustic = self.acoustic_residual_vector_quantizer.encode(x, n - self.num_semantic)
        return torch.cat([codes, acoustic], dim=1)


class CodecEncoder(nn.Module):
    """24 kHz waveform -> 12.5 Hz codes, as the official `Qwen3TTSTokenizerV2Model.encode`.

    Load the `encoder.*` tensors of `speech_tokenizer/model.safetensors` with the prefix
    stripped; `load_state_dict(..., strict=True)` then fits exactly.
    """

    def __init__(self, cfg: CodecEncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.encoder = _SEANetEncoder(cfg)
        self.encoder_transformer = _Transformer(cfg)
        self.downsample = _CausalConv(
            cfg.hidden_size,
            cfg.hidden_size,
            cfg.downsample_kernel,
            stride=_DOWNSAMPLE_STRIDE,
            bias=False,
            pad_mode="replicate",  # the one Mimi conv that repeats its edge instead of zero-padding
        )
        self.quantizer = _SplitResidualVQ(cfg)

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """Encode mono 24 kHz audio.

        Args:
            wav: (batch, samples) float waveform at `config.sampling_rate`, nominally in [-1, 1]
                (the official feature extractor passes it through unscaled). Every stage is
                causal, so right-padding a clip of n samples to batch it leaves its first
                n // samples_per_frame frames unchanged; only a last, partly covered frame can
                differ (it sees computed padding instead of zeros), as in the official batching.

        Returns:
            (batch, valid_num_quantizers, ceil(samples / samples_per_frame)) int64 codes,
            i.e. (B, 16, frames) for the shipped checkpoints.
        """
        if wav.dim() != 2 or wav.shape[-1] == 0 or not wav.is_floating_point():
            raise ValueError(f"wav must be a non-empty float (batch, samples) tensor, got {tuple(wav.shape)}")
        weight = self.downsample.conv.weight
        h = self.encoder(wav.to(device=weight.device, dtype=weight.dtype)[:, None, :])
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        h = self.downsample(h)
        return self.quantizer.encode(h, self.config.valid_num_quantizers)
