"""The 12 Hz codec decoder (codes -> 24 kHz waveform), truly incremental.

Everything in the decoder is causal: causal convolutions, causal transposed convolutions
and a sliding-window (72 frames) transformer. So a packet of P frames needs only a small
state from the frames before it (each conv's last inputs, each transposed conv's overhang,
the last 71 keys/values per layer) and yields exactly P * 1920 new samples. The one-shot
decode is the same code run once on all frames from an empty state.

Parameter names match the official `speech_tokenizer/model.safetensors` (prefix `decoder.`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from voxgate.engines.qwen3 import kernels, ops
from voxgate.engines.qwen3.layers import RMSNorm


@dataclass(frozen=True)
class CodecDecoderConfig:
    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    decoder_dim: int = 1536
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    num_quantizers: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    max_position_embeddings: int = 8000
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CodecDecoderConfig:
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
        for name in ("upsample_rates", "upsampling_ratios"):
            if name in known:
                known[name] = tuple(known[name])
        return cls(**known)

    @property
    def samples_per_frame(self) -> int:
        total = 1
        for r in (*self.upsample_rates, *self.upsampling_ratios):
            total *= r
        return total


@dataclass
class DecoderState:
    """What the decoder remembers between packets; `DecoderState()` is a fresh stream.

    A *static* state (see `freeze`) keeps every tensor in a fixed buffer updated in place and
    the frame position on the device, so a decode call can be captured as a CUDA graph. A
    batched view (`rows`) may carry `moving`, one flag per row: rows whose flag is False keep their
    state and position through the decode (a held stream, see `batch.py`).
    """

    position: int = 0
    tensors: dict[str, Any] = field(default_factory=dict)
    position_t: torch.Tensor | None = None  # set by freeze(): the position as a device tensor
    moving: torch.Tensor | None = None  # (rows,) bool on a batched view: which rows a decode advances

    def put(self, key: str, value: Any) -> None:
        held = self.tensors.get(key) if self.position_t is not None else None
        if held is None:
            self.tensors[key] = value
        elif isinstance(held, tuple):
            for buffer, new in zip(held, value, strict=True):
                self._store(buffer, new)
        else:
            self._store(held, value)

    def _store(self, buffer: torch.Tensor, new: torch.Tensor) -> None:
        if self.moving is None:
            buffer.copy_(new)
        else:
            keep = self.moving.view(-1, *(1,) * (new.dim() - 1))
            torch.where(keep, new, buffer, out=buffer)  # one kernel, as the copy it replaces

    def advance(self, frames: int) -> None:
        """The position after a decode of `frames` frames (rows not moving stay where they are)."""
        self.position += frames
        if self.position_t is not None:
            self.position_t.add_(frames if self.moving is None else self.moving * frames)

    def copy(self) -> DecoderState:
        """An independent (non-static) copy, e.g. of a voice's cached reference pre-roll."""
        tensors = {
            k: tuple(t.clone() for t in v) if isinstance(v, tuple) else v.clone() for k, v in self.tensors.items()
        }
        return DecoderState(self.position, tensors)

    @torch.inference_mode()
    def load(self, other: DecoderState) -> None:
        """Copy `other`'s state into this static state's buffers (same decoder, same shapes)."""
        for key, held in self.tensors.items():
            given = other.tensors[key]
            for buffer, value in zip(held if isinstance(held, tuple) else (held,),
                                     given if isinstance(given, tuple) else (given,), strict=True):  # fmt: skip
                buffer.copy_(value)
        self.position = other.position
        if self.position_t is not None:
            self.position_t.fill_(other.position)

    @torch.inference_mode()
    def freeze(self, device: torch.device) -> None:
        """Turn the buffers made by one decode into fixed ones, then reset to a fresh stream."""
        self.position_t = torch.zeros((), dtype=torch.long, device=device)
        self.reset()

    def freeze_rows(self, device: torch.device, batch: int) -> None:
        """Like `freeze`, for a state made by a decode of `batch` rows, each row its own stream
        with its own device-side position. The buffers become normal (not inference) tensors,
        which torch.compile can take as inputs."""
        with torch.inference_mode(False), torch.no_grad():
            self.tensors = {
                k: tuple(t.clone() for t in v) if isinstance(v, tuple) else v.clone() for k, v in self.tensors.items()
            }
            self.position_t = torch.zeros(batch, dtype=torch.long, device=device)
            self.reset()

    def rows(self, n: int, moving: torch.Tensor | None = None) -> DecoderState:
        """A static state over the first `n` rows of this one (views: the same buffers); with
        `moving` (n,) bool, a decode through it advances only the rows flagged True."""
        assert self.position_t is not None and self.position_t.dim() == 1
        tensors = {k: tuple(t[:n] for t in v) if isinstance(v, tuple) else v[:n] for k, v in self.tensors.items()}
        return DecoderState(0, tensors, self.position_t[:n], moving)

    @torch.inference_mode()
    def start_row(self, row: int, context: DecoderState | None = None) -> None:
        """Row `row` starts a new stream: zeroed, or continuing from a one-row `context`."""
        rows = torch.tensor([row], device=self.position_t.device if self.position_t is not None else "cpu")
        self.start_rows(rows, [(row, context)] if context is not None else [])

    @torch.inference_mode()
    def start_rows(self, rows: torch.Tensor, contexts: list[tuple[int, DecoderState]]) -> None:
        """Rows `rows` (a device tensor) start new streams, zeroed in one kernel per buffer;
        then each (row, context) pair continues from its one-row `context`."""
        assert self.position_t is not None and self.position_t.dim() == 1
        for held in self.tensors.values():
            for buffer in held if isinstance(held, tuple) else (held,):
                buffer.index_fill_(0, rows, 0)
        self.position_t.index_fill_(0, rows, 0)
        for row, context in contexts:
            for key, held in self.tensors.items():
                given = context.tensors[key]
                for i, buffer in enumerate(held if isinstance(held, tuple) else (held,)):
                    buffer[row].copy_((given[i] if isinstance(given, tuple) else given)[0])
            self.position_t[row] = context.position

    @torch.inference_mode()
    def reset(self) -> None:
        """Back to the start of a stream, keeping the buffers (static states only)."""
        for held in self.tensors.values():
            for buffer in held if isinstance(held, tuple) else (held,):
                buffer.zero_()
        self.position = 0
        if self.position_t is not None:
            self.position_t.zero_()


class _Derived(nn.Module):
    """A module whose forward uses tensors derived from its parameters (reshaped weights,
    exp() of log-scales, codebook tables): computed once, on first use, by the same ops
    as before (so results are unchanged), and kept as plain tensors. Work per packet drops,
    and torch.compile sees no parameter slicing. `CodecDecoder.refresh()` recomputes them."""

    _derived: tuple[torch.Tensor, ...] | None = None
    lean = False  # set by CodecDecoder.set_lean()

    def derive(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def derived(self) -> tuple[torch.Tensor, ...]:
        if self._derived is None:  # normal tensors even under inference_mode (torch.compile takes them)
            with torch.inference_mode(False), torch.no_grad():
                self._derived = tuple(t.detach().clone() for t in self.derive())
        return self._derived


class _Stateful(_Derived):
    key = ""  # set by CodecDecoder to the module's path, unique within the decoder


class CausalConv(_Stateful):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation)
        self.kernel, self.dilation = kernel, dilation

    fused = False  # set by CodecDecoder.fuse(): `activated` as one Triton product (kernels.conv_taps)

    def derive(self) -> tuple[torch.Tensor, ...]:
        weight2d = self.conv.weight.reshape(self.conv.out_channels, -1)
        if not self.fused or self.kernel == 1:  # a one-tap conv is a plain product: no taps form
            return (weight2d,)
        taps = self.conv.weight.permute(2, 1, 0).reshape(-1, self.conv.out_channels)  # row j * Cin + c
        return weight2d, taps.contiguous()

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        history = state.tensors.get(self.key)
        if history is None:
            history = x.new_zeros(x.shape[0], (self.kernel - 1) * self.dilation, x.shape[2])
        weight2d = self.derived()[0]
        y, new_history = ops.causal_conv(x, history, weight2d, self.conv.bias, self.kernel, self.dilation)
        state.put(self.key, new_history)
        return y

    def activated(self, x: torch.Tensor, act: SnakeBeta, state: DecoderState) -> torch.Tensor:
        """`self(act(x), state)` with the activation written straight after the history in one
        buffer (the same values; no concatenation of the activation, the largest copy of a
        conv at the decoder's long steps). `fused`: the conv as `kernels.conv_taps` over that
        buffer (the same sum in another order: values within rounding)."""
        span = (self.kernel - 1) * self.dilation
        if span == 0:
            return self(act(x), state)
        b, t, c = x.shape
        full = x.new_empty(b, span + t, c)
        history = state.tensors.get(self.key)
        if history is None:
            full[:, :span].zero_()
        else:
            full[:, :span].copy_(history)
        act(x, out=full[:, span:])
        if self.fused and c % 16 == 0:  # the product's channel blocks (every conv of the real codecs)
            y = kernels.conv_taps(full, self.derived()[1], self.conv.bias, self.kernel, self.dilation)
        else:
            y, _ = ops.unfolded_conv(full, self.derived()[0], self.conv.bias, self.kernel, self.dilation)
        state.put(self.key, full[:, full.shape[1] - span :])  # the new history: the buffer's last steps
        return y


class CausalTransConv(_Stateful):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.stride = stride

    def derive(self) -> tuple[torch.Tensor, ...]:
        c_in, c_out, k = self.conv.weight.shape
        return (self.conv.weight.reshape(c_in, c_out * k).T,)

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        _, c_out, k = self.conv.weight.shape
        tail = state.tensors.get(self.key)
        if tail is None:
            tail = x.new_zeros(x.shape[0], c_out, k - self.stride)
        (weight2d,) = self.derived()
        y, new_tail = ops.transposed_conv(x, tail, weight2d, self.conv.bias, self.stride, direct=self.lean)
        state.put(self.key, new_tail)
        return y


class SnakeBeta(_Derived):
    fused = False  # set by CodecDecoder.fuse(): one Triton kernel

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def derive(self) -> tuple[torch.Tensor, ...]:
        return torch.exp(self.alpha), 1.0 / (torch.exp(self.beta) + 1e-9)

    def forward(
        self, x: torch.Tensor, state: DecoderState | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The activation; into `out` (x's shape) when given."""
        if self.fused:
            return kernels.snake_beta(x, *self.derived(), out=out)
        y = ops.snake_beta(x, *self.derived())
        return y if out is None else out.copy_(y)


class DepthwiseConv(_Stateful):
    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, groups=channels)

    def derive(self) -> tuple[torch.Tensor, ...]:
        return (self.conv.weight[:, 0],)

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        k = self.conv.weight.shape[-1]
        history = state.tensors.get(self.key)
        if history is None:
            history = x.new_zeros(x.shape[0], k - 1, x.shape[2])
        (taps,) = self.derived()
        y, new_history = ops.depthwise_causal_conv(x, history, taps, self.conv.bias)
        state.put(self.key, new_history)
        return y


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = DepthwiseConv(dim, 7)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        h = self.dwconv(x, state)
        h = torch.nn.functional.layer_norm(h, self.norm.normalized_shape, self.norm.weight, self.norm.bias, 1e-6)
        h = ops.linear(h, self.pwconv1.weight, self.pwconv1.bias)
        h = ops.linear(torch.nn.functional.gelu(h), self.pwconv2.weight, self.pwconv2.bias)
        return x + self.gamma * h


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        h = self.conv1.activated(x, self.act1, state)
        return self.conv2(self.act2(h), state) + x


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        units = [ResidualUnit(c_out, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        for layer in self.block:
            x = layer(x, state)
        return x


class _Linear(nn.Linear):
    """nn.Linear whose forward goes through ops.linear (row-count-invariant on CPU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias)


class _Scale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class _Attention(_Stateful):
    fused = False  # set by CodecDecoder.fuse(): a static state's one-frame step as kernels.window_step

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = _Linear(cfg.hidden_size, heads * d, bias=False)
        self.k_proj = _Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = _Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = _Linear(heads * d, cfg.hidden_size, bias=False)
        self.heads, self.kv_heads, self.head_dim, self.window = heads, kv, d, cfg.sliding_window

    def derive(self) -> tuple[torch.Tensor, ...]:
        """The lean path's one projection: q, k and v, then RoPE's rotate-half of them (rows
        moved and negated, which is exact; v's is multiplied by sin = 0), with the attention's
        scale folded into q's rows where that is exact too (a power of two: head_dim 64 gives 1/8)."""
        q = self.q_proj.weight * self._folded_scale()
        qkv = torch.cat([q, self.k_proj.weight, self.v_proj.weight])
        heads = qkv.view(self.heads + 2 * self.kv_heads, self.head_dim, -1)
        half = self.head_dim // 2
        rotated = torch.cat([-heads[:, half:], heads[:, :half]], dim=1)
        return (torch.cat([qkv, rotated.reshape(qkv.shape)]),)

    def _folded_scale(self) -> float:
        scale = self.head_dim**-0.5
        return scale if math.frexp(scale)[0] == 0.5 else 1.0

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, state: DecoderState,
        blocked: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        if blocked is not None:
            return self._forward_lean(x, cos, sin, state, blocked)
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        past = state.tensors.get(self.key)
        if past is None:  # window-1 empty slots before the first frame
            empty = k.new_zeros(b, self.kv_heads, self.window - 1, self.head_dim)
            past = (empty, empty)
        keys, values = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        state.put(self.key, (keys[:, :, t:], values[:, :, t:]))
        blocked = ops.blocked_slots(valid_slots(state, self.window, t, x.device), self.window)  # empty slots
        return self._attend(q, keys, values, blocked)

    def _forward_lean(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, state: DecoderState, blocked: torch.Tensor
    ) -> torch.Tensor:
        """`forward` in fewer operations, the same values: one projection for q, k, v and their
        rotate-half (`derive`), RoPE on all heads at once (`cos`/`sin` from
        `_Transformer._value_heads`: 1 and 0 on v's heads), the attention's scale in q's
        projection where exact,
        keys and values kept as one cache tensor (one concatenation, one state write), and the
        empty-slot mask made once for all layers (`blocked`)."""
        b, t, _ = x.shape
        h, kv = self.heads, self.kv_heads
        (weight,) = self.derived()
        both = ops.linear(x, weight).view(b, t, 2, h + 2 * kv, self.head_dim)
        qkv = both[:, :, 0].transpose(1, 2) * cos + both[:, :, 1].transpose(1, 2) * sin  # apply_rope's sum
        past = state.tensors.get(self.key)
        if self.fused and t == 1 and state.position_t is not None and past is not None:  # a static state's frame
            scale = self.head_dim**-0.5 / self._folded_scale()
            out = kernels.window_step(qkv, past, state.position_t, state.moving, h, scale)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, h * self.head_dim))
        if past is None:  # window-1 empty slots before the first frame
            past = qkv.new_zeros(b, 2 * kv, self.window - 1, self.head_dim)
        cache = torch.cat([past, qkv[:, h:]], dim=2)
        state.put(self.key, cache[:, :, t:])
        return self._attend(qkv[:, :h], cache[:, :kv], cache[:, kv:], blocked, self._folded_scale())

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, blocked: torch.Tensor, folded: float = 1.0
    ) -> torch.Tensor:
        """Attention of `q` (already scaled by `folded`) over the window; through `o_proj`."""
        b, _, t, _ = q.shape
        if self.heads != self.kv_heads:
            keys = keys.repeat_interleave(self.heads // self.kv_heads, dim=1)
            values = values.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = ops.window_attention(q, keys, values, None, self.window, self.head_dim**-0.5 / folded, blocked=blocked)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


def valid_slots(state: DecoderState, window: int, t: int, device: torch.device) -> torch.Tensor:
    """Which of the window-1+t key slots hold a frame (False before the stream's first frame):
    (window-1+t,), or (B, 1, window-1+t) for batched streams at their own positions."""
    slots = torch.arange(window - 1 + t, device=device)
    start = state.position if state.position_t is None else state.position_t
    if isinstance(start, torch.Tensor) and start.dim() == 1:
        start = start[:, None, None]
    return slots + (start - (window - 1)) >= 0


class _MLP(_Derived):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = _Linear(dim, hidden, bias=False)
        self.up_proj = _Linear(dim, hidden, bias=False)
        self.down_proj = _Linear(hidden, dim, bias=False)

    def derive(self) -> tuple[torch.Tensor, ...]:
        """The lean path's one projection for gate and up."""
        return (torch.cat([self.gate_proj.weight, self.up_proj.weight]),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.lean:
            gate, up = ops.linear(x, self.derived()[0]).chunk(2, dim=-1)
            return self.down_proj(torch.nn.functional.silu(gate) * up)
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = _Scale(cfg.hidden_size)
        self.mlp_layer_scale = _Scale(cfg.hidden_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, state: DecoderState,
        blocked: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x), cos, sin, state, blocked)
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class _Transformer(nn.Module):
    lean = False  # set by CodecDecoder.set_lean()

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = _Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = _Linear(cfg.hidden_size, cfg.latent_dim)
        cos, sin = ops.rope_tables(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, state: DecoderState) -> torch.Tensor:
        t = x.shape[1]
        if state.position_t is None:
            positions = slice(state.position, state.position + t)
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        else:  # device-side position(s); clamped so an idle batch row can never index past the table
            index = (state.position_t[..., None] + torch.arange(t, device=x.device)).clamp(max=len(self.rope_cos) - 1)
            cos, sin = self.rope_cos[index], self.rope_sin[index]
            if index.dim() == 2:  # (B, T, D) -> (B, 1, T, D): one position per batch row
                cos, sin = cos[:, None], sin[:, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        blocked = None
        if self.lean:  # made once here instead of in every layer
            window = self.layers[0].self_attn.window
            blocked = ops.blocked_slots(valid_slots(state, window, t, x.device), window)
            cos, sin = self._value_heads(cos, sin)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, state, blocked)
        return self.output_proj(self.norm(h))

    def _value_heads(self, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for RoPE over q, k and v heads at once: as given on q's and k's heads, 1 and 0
        on v's (x * 1 + rotated * 0 == x). (T, D) -> (H + 2KV, T, D); (B, 1, T, D) -> (B, H + 2KV, T, D)."""
        attn = self.layers[0].self_attn
        roped, kept = attn.heads + attn.kv_heads, attn.kv_heads

        def extend(table: torch.Tensor, fill: float) -> torch.Tensor:
            table = table if table.dim() == 4 else table[None]
            lead, tail = table.shape[:-3], table.shape[-2:]
            constant = table.new_full((), fill).expand(*lead, kept, *tail)
            return torch.cat([table.expand(*lead, roped, *tail), constant], dim=-3)

        return extend(cos, 1.0), extend(sin, 0.0)


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))


class _VQLayer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _VQStack(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQLayer(size, dim) for _ in range(n))


class _RVQ(_Derived):
    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoder side; unused when decoding
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = _VQStack(n, size, dim)

    def derive(self) -> tuple[torch.Tensor, ...]:
        """The output projection (io_dim, dim), then one (size, dim) table per codebook."""
        books = [layer._codebook for layer in self.vq.layers]
        tables = [b.embedding_sum / b.cluster_usage.clamp(min=1e-5)[:, None] for b in books]
        return self.output_proj.weight[:, :, 0], *tables

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes: (B, n, T) -> (B, T, io_dim)."""
        projection, *tables = self.derived()
        total = None
        for i, table in enumerate(tables):
            part = torch.nn.functional.embedding(codes[:, i], table)
            total = part if total is None else total + part
        assert total is not None
        return ops.linear(total, projection)


class _Quantizer(_Derived):
    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.rvq_first = _RVQ(1, cfg.codebook_size, dim, cfg.codebook_dim)
        self.rvq_rest = _RVQ(cfg.num_quantizers - 1, cfg.codebook_size, dim, cfg.codebook_dim)

    def derive(self) -> tuple[torch.Tensor, ...]:
        """The lean path's tables: every codebook's in one (n * size, dim) table, and each
        codebook's first row in it."""
        tables = [*self.rvq_first.derived()[1:], *self.rvq_rest.derived()[1:]]
        size = tables[0].shape[0]
        return torch.cat(tables), torch.arange(len(tables), device=tables[0].device) * size

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        if self.lean:  # one lookup for all codebooks, one sum (in the same order) for the rest
            table, offsets = self.derived()
            vectors = torch.nn.functional.embedding(codes.transpose(1, 2) + offsets, table)  # (B, T, n, dim)
            first = ops.linear(vectors[:, :, 0], self.rvq_first.derived()[0])
            return first + ops.linear(vectors[:, :, 1:].sum(2), self.rvq_rest.derived()[0])
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class CodecDecoder(nn.Module):
    """codes (B, 16, T) -> waveform (B, T * 1920) in [-1, 1], packet by packet."""

    def __init__(self, cfg: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.quantizer = _Quantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = _Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)])
            for r in cfg.upsampling_ratios
        )
        blocks: list[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, rate in enumerate(cfg.upsample_rates):
            blocks.append(DecoderBlock(cfg.decoder_dim >> i, cfg.decoder_dim >> (i + 1), rate))
        out_dim = cfg.decoder_dim >> len(cfg.upsample_rates)
        blocks += [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        for name, module in self.named_modules():
            if isinstance(module, _Stateful):
                module.key = name

    def fuse(self, kernels: bool = False) -> None:
        """The GPU fast path (`kernels`): each Snake activation as one Triton kernel, and each
        conv that follows one (`CausalConv.activated`) as one implicit product over its
        [history | input] buffer, and the lean pre-transformer's attention for one frame of a
        static state as one kernel shifting its window in place. (cuDNN's convolutions instead
        of unfold + product were slower here, 8.8 vs 6.7 ms per 64-row frame on an H200, and
        their algorithm changes with the length: streamed drifted from offline to 42 dB SNR.)"""
        for module in self.modules():
            if isinstance(module, (SnakeBeta, CausalConv, _Attention)):
                module.fused = kernels
            if isinstance(module, CausalConv):
                module._derived = None

    def set_lean(self, on: bool = True) -> None:
        """The lean path: the same values in fewer operations (kernels on a GPU), ~1/3 fewer
        in the pre-transformer (see `_Attention._forward_lean`), one lookup for all codebooks,
        one projection for the MLP's gate and up. Set it before any decode: it stores the
        attention's keys and values as one tensor, so a state made by one path fits only it."""
        for module in self.modules():
            if "lean" in vars(type(module)) or isinstance(module, _Derived):
                module.lean = on

    def refresh(self) -> None:
        """Recompute the tensors derived from the weights (after the weights change)."""
        for module in self.modules():
            if isinstance(module, _Derived):
                module._derived = None

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor, state: DecoderState | None = None) -> torch.Tensor:
        """Decode frames that follow `state` (a fresh stream when None); updates `state`."""
        return self.run(codes, state if state is not None else DecoderState())

    def run(self, codes: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """`decode` without its inference-mode wrapper (for callers already inside one, or compiling)."""
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be (batch, {self.config.num_quantizers}, frames), got {tuple(codes.shape)}")
        batched = state.position_t is not None and state.position_t.dim() == 1  # the runner checks each row
        if not batched and state.position + codes.shape[-1] > self.config.max_position_embeddings:
            raise ValueError(f"the codec decodes at most {self.config.max_position_embeddings} frames per stream")
        h = self.quantizer.decode(codes.clamp(min=0))  # (B, T, C): channels last throughout
        h = self.pre_transformer(self.pre_conv(h, state), state)
        for trans, convnext in self.upsample:
            h = convnext(trans(h, state), state)
        *body, act, last = self.decoder
        for layer in body:
            h = layer(h, state)
        h = last.activated(h, act, state)
        state.advance(codes.shape[-1])
        return h[..., 0].clamp(-1.0, 1.0)
