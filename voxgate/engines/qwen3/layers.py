"""The Qwen3 decoder stack shared by the talker and the code predictor, with a
preallocated (static) KV cache so a decode step has fixed shapes.

Parameter names follow the official checkpoint (`layers.N.self_attn.q_proj`, ...). On the
CPU every op follows the reference's order (bit-level parity). `DecoderStack.fuse()` (the
loader calls it on a GPU) adds a faster path with fewer kernels per layer: one q/k/v
projection, one gate/up projection, q- and k-norm in one call, RoPE from tables, masks made
once per step instead of per layer. With `kernels=True` (Triton present) each layer is nine
kernels: norm+residual, q/k/v, q/k-norm+RoPE+cache write, attention, output projection,
norm+residual, gate/up, SiLU*up, down (see `kernels.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from voxgate.engines.qwen3 import gemv, kernels, ops
from voxgate.engines.qwen3.config import StackConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class KVCache:
    """Keys and values for every layer: (layers, batch, kv_heads, capacity, head_dim).

    `visible` (set by the batched runner) limits attention in the fixed-shape step to the
    first `visible` positions, so short streams do not read the whole capacity."""

    def __init__(self, cfg: StackConfig, batch: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, capacity, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = self.visible = capacity

    def view(self, rows: slice, visible: int | None = None) -> KVCache:
        """The same storage for batch rows `rows` (a view, no copy), attending to `visible` positions."""
        part = object.__new__(KVCache)
        part.k, part.v, part.capacity = self.k[:, rows], self.v[:, rows], self.capacity
        part.visible = visible or self.capacity
        return part


class Attention(nn.Module):
    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)  # QK-norm, per head, before RoPE
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.qkv: torch.Tensor | None = None  # set by fuse()
        self.qk_norm: torch.Tensor | None = None
        self.rot: torch.Tensor | None = None

    def fuse(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            self.qkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            self.rot = ops.rotation(self.head_dim, self.qkv.dtype, self.qkv.device)
            norms = [self.q_norm.weight.expand(self.heads, -1), self.k_norm.weight.expand(self.kv_heads, -1)]
            self.qk_norm = torch.cat(norms)  # (heads + kv_heads, head_dim)

    def _project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, D), k and v (B, KV, T, D): normed and rotated."""
        b, t, _ = x.shape
        if self.qkv is not None and self.qk_norm is not None and self.rot is not None:
            qkv = F.linear(x, self.qkv)
            split = (self.heads + self.kv_heads) * self.head_dim
            qk = qkv[..., :split].view(b, t, self.heads + self.kv_heads, self.head_dim)
            qk = F.rms_norm(qk, (self.head_dim,), eps=self.q_norm.eps) * self.qk_norm
            # RoPE while (B, T, heads, D) is contiguous (fast elementwise kernels), then transpose.
            cos, sin = (c[:, None] if c.dim() == 2 else c.transpose(1, 2) for c in (cos, sin))
            qk = ops.apply_rope_rotation(qk, cos, sin, self.rot)
            qk = qk.transpose(1, 2)
            v = qkv[..., split:].view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            return qk[:, : self.heads], qk[:, self.heads :], v
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin), v

    def attend(self, qkv: torch.Tensor, cache: KVCache, layer: int, span: Span) -> torch.Tensor:
        """Attention with the fused kernels from the q/k/v projection's output `qkv`
        (B, T, (H + 2 KV) * D): new positions at `span.positions`, attention over the first
        `span.end` cache slots under `span.mask`."""
        assert self.qk_norm is not None
        b, t, _ = qkv.shape
        q = kernels.qk_norm_rope_store(
            qkv, self.qk_norm, *span.rope, cache.k[layer], cache.v[layer],
            self.heads, self.kv_heads, self.q_norm.eps, span.positions,
        )  # fmt: skip
        end = span.end
        out = F.scaled_dot_product_attention(
            q, cache.k[layer, :, :, :end], cache.v[layer, :, :, :end], attn_mask=span.mask, enable_gqa=True
        )
        return gemv.linear(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim), self.o_proj.weight)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        start: int | torch.Tensor,
        step: StepIndex | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self._project(x, cos, sin)
        if isinstance(start, torch.Tensor):
            return self.o_proj(self._fixed_shape_step(q, k, v, cache, layer, step or StepIndex.make(start, b, cache)))
        end = start + t
        cache.k[layer, :, :, start:end] = k
        cache.v[layer, :, :, start:end] = v
        if x.is_cuda:  # fused attention; the CPU keeps the reference's exact op order (parity)
            mask = None if t == 1 else torch.ones(t, end, dtype=torch.bool, device=x.device).tril(start)
            out = F.scaled_dot_product_attention(
                q, cache.k[layer, :, :, :end], cache.v[layer, :, :, :end], attn_mask=mask, enable_gqa=True
            )
            return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))
        keys = cache.k[layer, :, :, :end].repeat_interleave(self.heads // self.kv_heads, dim=1)
        values = cache.v[layer, :, :, :end].repeat_interleave(self.heads // self.kv_heads, dim=1)
        scores = torch.matmul(q, keys.transpose(2, 3)) * self.head_dim**-0.5
        if t > 1:  # causal within the new block; earlier positions are all visible
            mask = torch.ones(t, end, dtype=torch.bool, device=x.device).tril(start)
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, values).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out)

    def _fixed_shape_step(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int, step: StepIndex
    ) -> torch.Tensor:
        """One new position per row, given on the device: the same shapes on every call (CUDA
        graphs), attention over the first `cache.visible` slots with later ones masked, GQA
        without copies."""
        b = q.shape[0]
        cache.k[layer][step.batch, :, step.rows] = k[:, :, 0]
        cache.v[layer][step.batch, :, step.rows] = v[:, :, 0]
        keys, values = cache.k[layer, :, :, : cache.visible], cache.v[layer, :, :, : cache.visible]
        if q.is_cuda:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.bias, enable_gqa=True)
            return out.transpose(1, 2).reshape(b, 1, self.heads * self.head_dim)
        groups = self.heads // self.kv_heads
        qg = q.reshape(b, self.kv_heads, groups, self.head_dim)
        scores = torch.matmul(qg, keys.transpose(2, 3)) * self.head_dim**-0.5  # (B, KV, G, visible)
        scores = scores.masked_fill(~step.visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values).reshape(b, 1, self.heads * self.head_dim)


@dataclass(frozen=True, slots=True)
class Span:
    """Where a fused-kernel forward writes and reads: RoPE tables, the new positions (an int for
    every row, or (B,)), the attended cache slots [0, end) and the mask over them."""

    rope: tuple[torch.Tensor, torch.Tensor]
    positions: int | torch.Tensor
    end: int
    mask: torch.Tensor | None


class StepIndex:
    """What every layer of one fixed-shape step needs, made once per step: the batch rows,
    each row's position, and which cache slots each row may see (B, 1, 1, visible); on a GPU
    also as an additive mask (0 or -inf), which attention would otherwise rebuild per layer."""

    __slots__ = ("batch", "bias", "rows", "visible")

    def __init__(self, batch: torch.Tensor, rows: torch.Tensor, visible: torch.Tensor, bias: torch.Tensor) -> None:
        self.batch, self.rows, self.visible, self.bias = batch, rows, visible, bias

    @classmethod
    def make(cls, position: torch.Tensor, b: int, cache: KVCache) -> StepIndex:
        rows = position.view(-1).expand(b).contiguous()
        slots = torch.arange(cache.visible, device=position.device)
        visible = (slots[None, :] <= rows[:, None])[:, None, None, :]
        bias = visible
        if position.is_cuda:
            bias = torch.zeros(visible.shape, dtype=cache.k.dtype, device=position.device)
            bias.masked_fill_(~visible, float("-inf"))
        return cls(torch.arange(b, device=position.device), rows, visible, bias)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.gate_up: torch.Tensor | None = None  # set by fuse()

    def fuse(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            self.gate_up = torch.cat([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderStack(nn.Module):
    """`layers` + final `norm`; `forward` runs positions start..start+T-1 and returns the
    final-normed hidden states."""

    def __init__(self, cfg: StackConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # set by fuse()
        self.kernels = False

    def fuse(self, positions: int = 8192, kernels: bool = False) -> None:
        """The fast path (see the module docstring); RoPE tables hold the same values the
        per-call computation gives, for `positions` positions."""
        self.kernels = kernels
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = self._rope_values(0, positions, self.norm.weight.dtype)
            self.rope_table = (cos, sin)

    def rope(self, start: int | torch.Tensor, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (T, D) for positions start..start+T-1; (B, 1, T, D) when `start` is (B,)."""
        if self.rope_table is not None and self.rope_table[0].dtype == dtype:
            cos, sin = self.rope_table
            if not isinstance(start, torch.Tensor):
                return cos[start : start + length], sin[start : start + length]
            if start.dim() == 1 and length == 1:
                return cos[start][:, None, None], sin[start][:, None, None]
        return self._rope_values(start, length, dtype)

    def _rope_values(
        self, start: int | torch.Tensor, length: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=self.inv_freq.device, dtype=torch.float32)
        if isinstance(start, torch.Tensor) and start.dim() == 1:
            positions = positions[None, :] + start[:, None]  # (B, T)
        else:
            positions = positions + start
        freqs = positions[..., None] * self.inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        if emb.dim() == 3:
            emb = emb[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x: torch.Tensor, cache: KVCache, start: int | torch.Tensor) -> torch.Tensor:
        if self.kernels and self.rope_table is not None and self.rope_table[0].dtype == x.dtype:
            return self._forward_kernels(x, cache, start, self.rope_table)
        cos, sin = self.rope(start, x.shape[1], x.dtype)
        step = StepIndex.make(start, x.shape[0], cache) if isinstance(start, torch.Tensor) else None
        for i, layer in enumerate(self.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, cache, i, start, step)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def _forward_kernels(
        self, x: torch.Tensor, cache: KVCache, start: int | torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """`forward` with the fused kernels: each norm also adds the residual before it."""
        b, t, _ = x.shape
        positions: int | torch.Tensor
        if isinstance(start, torch.Tensor):
            step = StepIndex.make(start, b, cache)
            positions, end, mask = step.rows, cache.visible, step.bias
        else:
            positions, end = start, start + t
            mask = None if t == 1 else torch.ones(t, end, dtype=torch.bool, device=x.device).tril(start)
        layers = self._forward_one_row if gemv.fits(x, self.layers[0].mlp.down_proj.weight) else self._forward_rows
        return layers(x, cache, Span(rope, positions, end, mask))

    def _forward_rows(self, x: torch.Tensor, cache: KVCache, span: Span) -> torch.Tensor:
        """The layers of `_forward_kernels` for any number of rows (cuBLAS products)."""
        eps = self.norm.eps
        residual, h = kernels.add_rms_norm(x, None, self.layers[0].input_layernorm.weight, eps)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            assert attn.qkv is not None
            attended = attn.attend(F.linear(h, attn.qkv), cache, i, span)
            residual, h = kernels.add_rms_norm(residual, attended, layer.post_attention_layernorm.weight, eps)
            mlp = layer.mlp
            assert mlp.gate_up is not None
            out = mlp.down_proj(kernels.silu_mul(F.linear(h, mlp.gate_up)))
            following = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            residual, h = kernels.add_rms_norm(residual, out, following.weight, eps)
        return h

    def _forward_one_row(self, x: torch.Tensor, cache: KVCache, span: Span) -> torch.Tensor:
        """`_forward_rows` for one row: each residual add + norm, and SiLU*up, runs inside
        the matrix-vector product after it (`gemv.py`), six kernels per layer instead of nine."""
        eps = self.norm.eps
        residual, delta = x, None
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            assert attn.qkv is not None and mlp.gate_up is not None
            residual, qkv = gemv.norm_linear(residual, delta, layer.input_layernorm.weight, eps, attn.qkv)
            attended = attn.attend(qkv, cache, i, span)
            residual, gate_up = gemv.norm_linear(residual, attended, layer.post_attention_layernorm.weight, eps,
                                                 mlp.gate_up)  # fmt: skip
            delta = gemv.silu_linear(gate_up, mlp.down_proj.weight)
        return kernels.add_rms_norm(residual, delta, self.norm.weight, eps)[1]
