"""Fused GPU kernels (Triton) for the fast path: each replaces several PyTorch kernels.

On a GPU a decode step is bound by the number of kernels it launches, not by arithmetic, so
what matters is how many small elementwise kernels sit between the matrix products. These
fold them together; each computes in float32 and rounds once on store:

- `add_rms_norm`: residual add + RMSNorm (+ weight) in one pass (was: add, norm);
- `qk_norm_rope_store`: per-head q/k RMSNorm, RoPE, and the k/v writes into the KV cache
  at each row's position (was: norm, weight multiply, three RoPE kernels, two cache writes);
- `silu_mul`: SiLU(gate) * up from the fused gate/up projection (was: two or three);
- `snake_beta`: the codec's x + 1/beta sin^2(alpha x) (was: five kernels, four of them
  broadcasting, which PyTorch runs unvectorized);
- `conv_taps`: a causal conv over its [history | input] buffer as one implicit product (was:
  an unfolded copy of the input k times over, then the product);
- `window_step`: the codec pre-transformer's sliding-window attention for one new frame, its
  window shifted in place (was: a concatenation, a state write, unfolds and elementwise
  products over the whole window).

`available()` says whether they can run (Triton importable, tensors on CUDA); callers keep
their PyTorch path otherwise (the CPU, always: it follows the reference's op order).
"""

from __future__ import annotations

import functools

import torch

try:  # Triton comes with CUDA builds of PyTorch; CPU machines run without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None


@functools.cache
def available() -> bool:
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, d_ptr, res_ptr, out_ptr, w_ptr, n, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        if HAS_DELTA:  # the residual stream is stored rounded, as an unfused add would leave it
            d = tl.load(d_ptr + row * n + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + row * n + cols, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n + cols, (xf * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _qk_norm_rope_store_kernel(
        qkv_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, pos_stride, start, q_ptr, k_ptr, v_ptr,
        T, H, KV, s_b, s_h, s_t, eps, HAS_POS: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        token = tl.program_id(0).to(tl.int64)  # b * T + t
        head = tl.program_id(1)  # q heads, then k heads, then v heads
        b = token // T
        t = token % T
        if HAS_POS:
            p = tl.load(pos_ptr + b * pos_stride) + t
        else:
            p = start + t
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        src = qkv_ptr + token * (H + 2 * KV) * D + head * D
        x1 = tl.load(src + i)
        x2 = tl.load(src + half + i)
        if head < H + KV:
            a1 = x1.to(tl.float32)
            a2 = x2.to(tl.float32)
            rstd = tl.rsqrt((tl.sum(a1 * a1, axis=0) + tl.sum(a2 * a2, axis=0)) / D + eps)
            n1 = a1 * rstd * tl.load(w_ptr + head * D + i).to(tl.float32)
            n2 = a2 * rstd * tl.load(w_ptr + head * D + half + i).to(tl.float32)
            c1 = tl.load(cos_ptr + p * D + i).to(tl.float32)
            c2 = tl.load(cos_ptr + p * D + half + i).to(tl.float32)
            s1 = tl.load(sin_ptr + p * D + i).to(tl.float32)
            s2 = tl.load(sin_ptr + p * D + half + i).to(tl.float32)
            o1 = n1 * c1 - n2 * s1
            o2 = n2 * c2 + n1 * s2
            if head < H:
                dst = q_ptr + ((b * H + head) * T + t) * D
                tl.store(dst + i, o1.to(q_ptr.dtype.element_ty))
                tl.store(dst + half + i, o2.to(q_ptr.dtype.element_ty))
            else:
                dst = k_ptr + b * s_b + (head - H) * s_h + p * s_t
                tl.store(dst + i, o1.to(k_ptr.dtype.element_ty))
                tl.store(dst + half + i, o2.to(k_ptr.dtype.element_ty))
        else:
            dst = v_ptr + b * s_b + (head - H - KV) * s_h + p * s_t
            tl.store(dst + i, x1)
            tl.store(dst + half + i, x2)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n
        gate = tl.load(x_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * 2 * n + n + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _snake_beta_kernel(
        x_ptr, alpha_ptr, inv_beta_ptr, out_ptr, n, C, row, s_out, BLOCK: tl.constexpr, STRIDED: tl.constexpr
    ):  # fmt: skip
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # flat index into (..., C)
        mask = at < n
        c = at % C
        x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
        s = tl.sin(x * tl.load(alpha_ptr + c, mask=mask, other=0.0).to(tl.float32))
        y = x + tl.load(inv_beta_ptr + c, mask=mask, other=0.0).to(tl.float32) * s * s
        dest = at
        if STRIDED:  # `out`'s leading rows are apart (a view into a larger buffer)
            dest = (at // row) * s_out + at % row
        tl.store(out_ptr + dest, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["M", "T", "L", "DIL"])  # one compile per layer shape, whatever the batch
    def _conv_taps_kernel(
        full_ptr, w_ptr, bias_ptr, out_ptr, M, T, L, DIL, CIN: tl.constexpr, COUT: tl.constexpr,
        TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ):  # fmt: skip
        rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)  # output rows, b * T + t
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        m_ok = rm < M
        n_ok = rn < COUT
        b = rm // T
        first = (b * L + rm - b * T) * CIN  # tap 0's input step: t of row b of `full`, channel 0
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kk in range(0, TAPS * CIN, BK):  # (tap, channel block); CIN is a multiple of BK
            j = kk // CIN
            a = tl.load(full_ptr + first[:, None] + (j * DIL * CIN + kk - j * CIN) + rk[None, :], mask=m_ok[:, None])
            w = tl.load(w_ptr + (kk + rk)[:, None] * COUT + rn[None, :], mask=n_ok[None, :], other=0.0)
            if IEEE:
                acc = tl.dot(a, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        at = rm[:, None] * COUT + rn[None, :]
        tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _window_step_kernel(
        qkv_ptr, s_qb, s_qh, past_ptr, s_pb, s_ph, pos_ptr, s_pos, moving_ptr, out_ptr, scale,
        H: tl.constexpr, KV: tl.constexpr, W: tl.constexpr, D: tl.constexpr, BLOCK_W: tl.constexpr,
        HAS_MOVING: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        g = tl.program_id(1)  # the kv head; its H // KV query heads share it
        slots = tl.arange(0, BLOCK_W)  # 0 .. W-2: the past frames, oldest first; W-1: the new one
        d = tl.arange(0, D)
        past = slots[:, None] < W - 1
        new = slots[:, None] == W - 1
        k_at = past_ptr + b * s_pb + g * s_ph + slots[:, None] * D + d[None, :]
        v_at = k_at + KV * s_ph
        k = tl.load(k_at, mask=past, other=0.0)
        v = tl.load(v_at, mask=past, other=0.0)
        k_new = tl.load(qkv_ptr + b * s_qb + (H + g) * s_qh + d)
        v_new = tl.load(qkv_ptr + b * s_qb + (H + KV + g) * s_qh + d)
        k = tl.where(new, k_new[None, :], k)
        v = tl.where(new, v_new[None, :], v)
        position = tl.load(pos_ptr + b * s_pos)  # the new frame's; slots before the stream's start are empty
        visible = (slots < W) & (slots + position - (W - 1) >= 0)
        for i in tl.static_range(H // KV):
            head = g * (H // KV) + i
            q = tl.load(qkv_ptr + b * s_qb + head * s_qh + d).to(tl.float32)
            scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
            scores = tl.where(visible, scores, float("-inf"))
            p = tl.exp(scores - tl.max(scores, axis=0))
            p = p / tl.sum(p, axis=0)
            out = tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            tl.store(out_ptr + (b * H + head) * D + d, out.to(out_ptr.dtype.element_ty))
        keep = (slots[:, None] >= 1) & (slots[:, None] < W)  # the next frame's window: slots 1 .. W-1 to 0 .. W-2
        if HAS_MOVING:  # a held row keeps its window
            keep = keep & (tl.load(moving_ptr + b) != 0)
        tl.debug_barrier()  # every thread has read the window before any writes it shifted
        tl.store(k_at - D, k, mask=keep)
        tl.store(v_at - D, v, mask=keep)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta) * weight) over the last dim; with `delta` None, (x, norm(x))."""
    n = x.shape[-1]
    x = x.contiguous()
    residual = x if delta is None else torch.empty_like(x)
    out = torch.empty_like(x)
    rows = x.numel() // n
    d = x if delta is None else delta.contiguous()
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(rows,)](
        x, d, residual, out, weight, n, eps, HAS_DELTA=delta is not None, BLOCK=block, num_warps=4 if n <= 1024 else 8
    )
    return residual, out


def qk_norm_rope_store(
    qkv: torch.Tensor,
    norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    kv_heads: int,
    eps: float,
    start: int | torch.Tensor,
) -> torch.Tensor:
    """From the fused projection `qkv` (B, T, (H + 2 KV) * D): q (B, H, T, D) normed and rotated;
    k (normed, rotated) and v written into `k_cache`/`v_cache` (B, KV, capacity, D) at
    positions start.. (`start` an int for every row, or (B,) per row).

    `norm_weight` is (H + KV, D): q-norm weight per q head then k-norm weight per k head;
    `cos`/`sin` are the (positions, D) RoPE tables."""
    b, t, _ = qkv.shape
    d = k_cache.shape[-1]
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("the KV cache's last dim must be contiguous, the same layout for k and v")
    qkv = qkv.contiguous()
    q = torch.empty(b, heads, t, d, dtype=qkv.dtype, device=qkv.device)
    s_b, s_h, s_t, _ = k_cache.stride()
    if isinstance(start, torch.Tensor):  # a position per row
        positions, stride, first = start, start.stride(0), 0
    else:  # `positions` is not read
        positions, stride, first = qkv, 0, start
    _qk_norm_rope_store_kernel[(b * t, heads + 2 * kv_heads)](
        qkv, norm_weight, cos, sin, positions, stride, first, q, k_cache, v_cache,
        t, heads, kv_heads, s_b, s_h, s_t, eps, HAS_POS=isinstance(start, torch.Tensor), D=d, num_warps=1,
    )  # fmt: skip
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, `gate_up` (..., 2I) holding gate then up -> (..., I)."""
    n = gate_up.shape[-1] // 2
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty(*gate_up.shape[:-1], n)
    block = 1024
    _silu_mul_kernel[(gate_up.numel() // (2 * n), triton.cdiv(n, block))](gate_up, out, n, BLOCK=block, num_warps=4)
    return out


def snake_beta(
    x: torch.Tensor, alpha_exp: torch.Tensor, inv_beta: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x + inv_beta * sin(alpha_exp * x)^2 per channel, x (B, ..., C) channels last -> contiguous,
    or written into `out` (x's shape; contiguous but for its first dim's stride: e.g. the tail of
    a conv's [history | input] buffer, so the conv needs no concatenation)."""
    x = x.contiguous()
    row = x[0].numel() if x.dim() > 1 else x.numel()
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or (x.dim() > 1 and not out[0].is_contiguous()):
        raise ValueError("snake_beta: `out` must have x's shape, each leading row contiguous")
    s_out = out.stride(0) if x.dim() > 1 else row
    block = 1024
    _snake_beta_kernel[(triton.cdiv(x.numel(), block),)](
        x, alpha_exp, inv_beta, out, x.numel(), x.shape[-1], row, s_out, BLOCK=block, STRIDED=s_out != row,
        num_warps=4,
    )  # fmt: skip
    return out


def conv_taps_tiles(m: int, c_in: int, c_out: int) -> tuple[int, int, int, int, int]:
    """(BM, BN, BK, warps, stages) for `conv_taps` of m output rows. From the H200 sweeps
    (bench/qwen3_conv_taps.py; codec-conv-taps-cv06-seed7-h200-20261128.json): under 1,024 rows
    (one stream's early layers) narrower tiles give more programs, 0.68 -> 0.57 ms over the 13
    convs at one row; from 64 rows up these defaults were within noise of the best of 48 sets."""
    if m < 1024 and c_in % 32 == 0:
        return 64, max(16, min(64, triton.next_power_of_2(c_out))), 32, 4, 4
    bn = max(16, min(128, triton.next_power_of_2(c_out)))
    bk = 64 if c_in % 64 == 0 else 32 if c_in % 32 == 0 else 16
    bm = 128 if m >= 16384 else 64 if m >= 512 else 32
    return bm, bn, bk, 8 if bm * bn >= 128 * 128 else 4, 3


def conv_taps(
    full: torch.Tensor, weight_taps: torch.Tensor, bias: torch.Tensor | None, taps: int, dilation: int,
    tiles: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:  # fmt: skip
    """A causal conv of an input already laid after its history, as one implicit matrix
    product: full (B, span + T, Cin) channels last, span = (taps - 1) * dilation; weight_taps
    (taps * Cin, Cout), row j * Cin + c = tap j, input channel c. -> (B, T, Cout), y[b, t] =
    bias + sum_j full[b, t + j * dilation] @ weight_taps[j * Cin : (j + 1) * Cin]. Each tap's
    rows are read from `full` in place: no unfolded copy of the input `taps` times over (at the
    decoder's long steps, that copy and its product took 0.5 ms of a 128-row frame per conv on an
    H200, ~10x the arithmetic's floor). The sum runs in another order than the unfolded
    product's, so values differ from it by rounding. `tiles`: see `conv_taps_tiles` (a sweep)."""
    full = full.contiguous()
    b, length, c_in = full.shape
    t = length - (taps - 1) * dilation
    c_out = weight_taps.shape[1]
    if weight_taps.shape[0] != taps * c_in or t < 0 or c_in % 16:
        raise ValueError("conv_taps: weight_taps must be (taps * Cin, Cout), Cin a multiple of 16")
    out = full.new_empty(b, t, c_out)
    m = b * t
    if m == 0:
        return out
    bm, bn, bk, warps, stages = tiles or conv_taps_tiles(m, c_in, c_out)
    grid = (triton.cdiv(m, bm), triton.cdiv(c_out, bn))
    _conv_taps_kernel[grid](
        full, weight_taps, bias if bias is not None else full, out, m, t, length, dilation, CIN=c_in, COUT=c_out,
        TAPS=taps, HAS_BIAS=bias is not None, IEEE=full.dtype == torch.float32, BM=bm, BN=bn, BK=bk,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def window_step(
    qkv: torch.Tensor, past: torch.Tensor, position: torch.Tensor, moving: torch.Tensor | None, heads: int,
    scale: float,
) -> torch.Tensor:  # fmt: skip
    """One new frame of sliding-window attention, the window kept in `past` shifted in place.
    qkv (B, H + 2 KV, 1, D): the frame's queries, keys and values (after RoPE); past (B, 2 KV,
    W - 1, D) contiguous: the W - 1 frames before it, keys then values, oldest first; position
    (B,) or (): the new frame's position (slots before the stream's start are masked);
    moving (B,) bool or None: rows whose window moves on (a held row keeps it). Each query
    head attends to the W slots [past | new] of its kv head, float32 inside. -> (B, H, 1, D).
    Afterwards `past` holds the last W - 1 of those slots (of moving rows). The same sum as
    `ops.window_attention`'s in float32 rather than in the activations' type."""
    b, n_heads, t, d = qkv.shape
    kv = (n_heads - heads) // 2
    if t != 1 or past.shape[:2] != (b, 2 * kv) or past.shape[3] != d or not past.is_contiguous():
        raise ValueError("window_step: one frame, and a contiguous (B, 2 KV, W - 1, D) window")
    if qkv.stride(3) != 1:
        qkv = qkv.contiguous()
    window = past.shape[2] + 1
    out = qkv.new_empty(b, heads, 1, d)
    position = position.reshape(-1)
    _window_step_kernel[(b, kv)](
        qkv, qkv.stride(0), qkv.stride(1), past, past.stride(0), past.stride(1), position,
        0 if position.numel() == 1 else position.stride(0), moving if moving is not None else position, out, scale,
        H=heads, KV=kv, W=window, D=d, BLOCK_W=triton.next_power_of_2(window), HAS_MOVING=moving is not None,
        num_warps=4,
    )  # fmt: skip
    return out
