"""The Qwen3 decoder stack shared by the talker and the code predictor, with a
preallocated (static) KV cache so a decode step has fixed shapes.

Parameter names follow the official checkpoint (`layers.N.self_attn.q_proj`, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxgate.engines.qwen3 import ops
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

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        start: int | torch.Tensor,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        if isinstance(start, torch.Tensor):
            return self.o_proj(self._fixed_shape_step(q, k, v, cache, layer, start))
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
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int, position: torch.Tensor
    ) -> torch.Tensor:
        """One new position per row given as a device tensor (a scalar, or (B,) for rows at
        different positions): the same shapes on every call (CUDA graphs), attention over
        the first `cache.visible` slots with later ones masked, GQA without copies."""
        b = q.shape[0]
        rows = position.view(-1).expand(b)
        batch = torch.arange(b, device=q.device)
        cache.k[layer][batch, :, rows] = k[:, :, 0]
        cache.v[layer][batch, :, rows] = v[:, :, 0]
        keys, values = cache.k[layer, :, :, : cache.visible], cache.v[layer, :, :, : cache.visible]
        slots = torch.arange(cache.visible, device=q.device)
        later = slots[None, :] > rows[:, None]  # (B, visible)
        if q.is_cuda:
            mask = ~later[:, None, None, :]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
            return out.transpose(1, 2).reshape(b, 1, self.heads * self.head_dim)
        groups = self.heads // self.kv_heads
        qg = q.reshape(b, self.kv_heads, groups, self.head_dim)
        scores = torch.matmul(qg, keys.transpose(2, 3)) * self.head_dim**-0.5  # (B, KV, G, visible)
        scores = scores.masked_fill(later[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values).reshape(b, 1, self.heads * self.head_dim)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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

    def rope(self, start: int | torch.Tensor, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin (T, D) for positions start..start+T-1; (B, 1, T, D) when `start` is (B,)."""
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
        cos, sin = self.rope(start, x.shape[1], x.dtype)
        for i, layer in enumerate(self.layers):
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, cache, i, start)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)
