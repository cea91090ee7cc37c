"""Primitives whose result for one output element does not depend on how many elements
are computed together, so a stream decoded packet by packet equals the one-shot decode
bit for bit on the CPU.

Three rules make that hold with PyTorch's CPU kernels:
- matrix products always run on a multiple of 8 rows (the BLAS computes leftover rows
  with other, differently rounded kernels), so rows are zero-padded to the next multiple;
- convolutions are unfolded into those matrix products instead of calling conv kernels,
  whose algorithm changes with the input length;
- attention looks at a fixed window of keys per query, so every softmax row has the same
  length and layout whatever the chunking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_ROWS = 8


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` over the last dim; on CPU the row count is padded to a multiple of 8."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    pad = -n % MIN_ROWS
    if x.device.type == "cpu" and pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    out = F.linear(rows, weight, bias)[:n]
    return out.reshape(*x.shape[:-1], weight.shape[0])


def causal_conv(
    x: torch.Tensor, history: torch.Tensor, weight2d: torch.Tensor, bias: torch.Tensor | None, k: int, dilation: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal stride-1 conv over time as one matrix product, channels last.

    x: (B, T, Cin); history: (B, (k-1)*dilation, Cin), the inputs just before x (zeros at the
    start); weight2d: (Cout, Cin*k), the conv weight flattened. Returns (y: (B, T, Cout),
    the new history). Channels last, the product's output is the next layer's input as it
    stands (no transposed copies) and each time step's channels are contiguous.
    """
    if k == 1:
        return linear(x, weight2d, bias), history
    full = torch.cat([history, x], dim=1)  # (B, span + T, Cin)
    return unfolded_conv(full, weight2d, bias, k, dilation)


def unfolded_conv(
    full: torch.Tensor, weight2d: torch.Tensor, bias: torch.Tensor | None, k: int, dilation: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`causal_conv` of an input already laid after its history: full (B, span + T, Cin).
    Returns (y: (B, T, Cout), the new history: a view of `full`'s last span steps)."""
    span = (k - 1) * dilation
    b, t, c_in = full.shape[0], full.shape[1] - span, full.shape[2]
    windows = full.unfold(1, span + 1, 1)[..., ::dilation]  # (B, T, Cin, k): the weight's (Cin, k) order
    return linear(windows.reshape(b, t, c_in * k), weight2d, bias), full[:, full.shape[1] - span :]


def depthwise_causal_conv(
    x: torch.Tensor, history: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv (groups = channels) as a fixed-order sum over taps, channels last.

    x: (B, T, C); taps: (C, k); history: (B, k-1, C)."""
    k = taps.shape[-1]
    full = torch.cat([history, x], dim=1)
    t = x.shape[1]
    y = full[:, 0:t] * taps[:, 0]
    for j in range(1, k):
        y = y + full[:, j : j + t] * taps[:, j]
    return y + bias, full[:, full.shape[1] - (k - 1) :]


def transposed_conv(
    x: torch.Tensor, tail: torch.Tensor, weight2d: torch.Tensor, bias: torch.Tensor, stride: int, direct: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal transposed conv, kernel = stride or 2*stride, right overhang trimmed, channels last.

    x: (B, T, Cin); weight2d: (Cout*k, Cin) from the (Cin, Cout, k) weight; tail: (B, Cout,
    k - stride), what the previous frame adds onto this one (zeros at the start).
    Returns (y: (B, T*stride, Cout), the new tail). `direct`: the bias add writes straight into
    that layout (the same values, one copy fewer).
    """
    b, t, _ = x.shape
    c_out = bias.shape[0]
    k = weight2d.shape[0] // c_out
    y = linear(x, weight2d).reshape(b, t, c_out, k)
    head = y[..., :stride]
    if direct:  # each sum straight into the output layout, in the same order: no concatenated copy
        out = y.new_empty(b, t, stride, c_out)
        laid = out.transpose(2, 3)  # (B, T, Cout, stride) view
        if k > stride:
            over = y[..., stride:]  # lands on the next frame's first `stride` samples
            torch.add(head[:, :1], tail.unsqueeze(1), out=laid[:, :1])
            torch.add(head[:, 1:], over[:, :-1], out=laid[:, 1:])
            laid += bias[:, None]
            tail = over[:, -1]
        else:
            torch.add(head, bias[:, None], out=laid)
        return out.view(b, t * stride, c_out), tail
    if k > stride:
        over = y[..., stride:]  # lands on the next frame's first `stride` samples
        head = head + torch.cat([tail.unsqueeze(1), over[:, :-1]], dim=1)
        tail = over[:, -1]
    return (head + bias[:, None]).transpose(2, 3).reshape(b, t * stride, c_out), tail


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    if x.is_cuda:  # one fused kernel; the CPU keeps the reference's op-by-op formula (parity)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def snake_beta(x: torch.Tensor, alpha_exp: torch.Tensor, inv_beta: torch.Tensor) -> torch.Tensor:
    """x + 1/beta * sin(alpha x)^2 with exp() of the log-parameters precomputed; (..., C)."""
    return x + inv_beta * torch.sin(x * alpha_exp).pow(2)


def rope_tables(head_dim: int, theta: float, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for every position, (max_positions, head_dim), float32 (half-split layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, D); cos/sin: (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rotation(head_dim: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """R with x @ R == cat([-x2, x1]) (RoPE's rotate-half) exactly: one signed 1 per column."""
    half = head_dim // 2
    r = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    r[torch.arange(half) + half, torch.arange(half)] = -1
    r[torch.arange(half), torch.arange(half) + half] = 1
    return r


def apply_rope_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """`apply_rope` in three kernels (a product with `rotation()`, a multiply, a fused
    multiply-add) instead of five, with no strided slices: for the GPU fast path."""
    return torch.addcmul(x * cos, x @ rot, sin)


def window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None, window: int, scale: float,
    blocked: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """Causal sliding-window attention where every query sees exactly `window` key slots.

    q: (B, H, T, D) for the T newest positions; k, v: (B, H, window - 1 + T, D) holding the
    window-1 positions before them and the T new ones; valid: (window - 1 + T,) bool, False
    for slots before the start of the sequence, or (B, 1, window - 1 + T) when each row
    starts elsewhere; or, instead, `blocked`: `blocked_slots(valid, window)` made once for all layers.
    Returns (B, H, T, D).
    """
    kw = k.unfold(2, window, 1).transpose(-1, -2)  # (B, H, T, window, D)
    vw = v.unfold(2, window, 1).transpose(-1, -2)
    if blocked is None:
        assert valid is not None
        blocked = blocked_slots(valid, window)
    scores = (q.unsqueeze(-2) * kw).sum(-1)
    if scale != 1.0:  # 1.0: the caller scaled q
        scores = scores * scale
    scores = scores.masked_fill(blocked, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return (probs.unsqueeze(-1) * vw).sum(-2)


def blocked_slots(valid: torch.Tensor, window: int) -> torch.Tensor:
    """`window_attention`'s mask from `valid`: True for each query's key slots that are empty,
    (T, window), or (B, 1, T, window) for per-row starts."""
    return ~valid.unfold(-1, window, 1)
