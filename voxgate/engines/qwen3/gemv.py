"""One-row matrix-vector products (Triton) for the single-stream step, with the element-wise
op before them folded in.

At one row a linear layer does no more than stream its weight matrix from memory once, so
what counts is how close it gets to HBM bandwidth, and how many small kernels sit between
the products. This kernel splits the output rows over many small programs (512 to 1536 for
the 0.6B shapes) to keep every SM's loads in flight, reads each weight once with an evict-first hint (it is not read
again within the step), and accumulates in float32. Each program also builds the input
vector itself (it is at most a few KiB, read from L2), so the op before the product needs
no kernel of its own:

- `norm_linear`: RMSNorm(x + delta) * weight, then the product (the residual add and norm
  before q/k/v and before gate/up); program 0 also writes the residual x + delta;
- `silu_linear`: SiLU(gate) * up from the gate/up projection's output, then the product
  (before down).

Rounding follows the unfused kernels: the residual and the normed (or SiLU'd) vector are
rounded to the weight's dtype before the product. Only the summation order differs from
cuBLAS, so this runs in bf16/fp16 only (`fits`); float32 keeps cuBLAS and its exact proofs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from voxgate.engines.qwen3.kernels import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _gemv_kernel(
        x_ptr, d_ptr, nw_ptr, res_ptr, w_ptr, out_ptr, N, eps,
        K: tl.constexpr, KC: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr, HAS_DELTA: tl.constexpr,
    ):  # fmt: skip
        # MODE 0: x as is; 1: RMSNorm(x + delta) * nw; 2: SiLU(x[:K]) * x[K:].
        pid = tl.program_id(0)
        rows = (pid * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        row_ok = rows < N
        cols = tl.arange(0, KC)
        rstd = 0.0
        if MODE == 1:  # the residual's rstd first (a second pass over x hits L1/L2)
            ss = tl.zeros([KC], tl.float32)
            for k0 in tl.static_range(0, K, KC):
                r = tl.load(x_ptr + k0 + cols)
                if HAS_DELTA:  # rounded, as the unfused add leaves the residual stream
                    r = (r.to(tl.float32) + tl.load(d_ptr + k0 + cols).to(tl.float32)).to(res_ptr.dtype.element_ty)
                    tl.store(res_ptr + k0 + cols, r, mask=(cols < KC) & (pid == 0))
                rf = r.to(tl.float32)
                ss += rf * rf
            rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        acc = tl.zeros([BLOCK_N, KC], tl.float32)
        for k0 in tl.static_range(0, K, KC):
            w = tl.load(
                w_ptr + rows[:, None] * K + k0 + cols[None, :], mask=row_ok[:, None], other=0.0,
                eviction_policy="evict_first",
            )  # fmt: skip
            if MODE == 0:
                v = tl.load(x_ptr + k0 + cols).to(tl.float32)
            elif MODE == 1:
                r = tl.load(x_ptr + k0 + cols)
                if HAS_DELTA:
                    r = (r.to(tl.float32) + tl.load(d_ptr + k0 + cols).to(tl.float32)).to(res_ptr.dtype.element_ty)
                n = r.to(tl.float32) * rstd * tl.load(nw_ptr + k0 + cols).to(tl.float32)
                v = n.to(w_ptr.dtype.element_ty).to(tl.float32)
            else:
                g = tl.load(x_ptr + k0 + cols).to(tl.float32)
                u = tl.load(x_ptr + K + k0 + cols).to(tl.float32)
                v = (g / (1.0 + tl.exp(-g)) * u).to(w_ptr.dtype.element_ty).to(tl.float32)
            acc += w.to(tl.float32) * v[None, :]
        tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_ok)


HALF = (torch.bfloat16, torch.float16)
PLAIN, NORM, SILU = 0, 1, 2  # what the kernel does to its input before the product


def fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the one-row kernel takes `x` (..., K) against `weight` (N, K): one row, on CUDA
    with Triton, in bf16/fp16 (float32 stays on cuBLAS, whose results the exact proofs pin)."""
    return (
        triton is not None
        and x.is_cuda
        and x.dtype in HALF
        and weight.dtype == x.dtype
        and x.numel() == x.shape[-1]
        and weight.is_contiguous()
    )


def config(mode: int, k: int) -> tuple[int, int, int]:
    """(rows per program, K chunk, warps), measured on an H100 with the weights cold in L2
    (`.gpu/gemv_bench.py`, each shape of the 0.6B step swept): many small programs win (two
    rows each for a plain product); a program that builds its input (norm: x, delta and the
    norm weight; SiLU: 2K values) does best with four (norm) or two rows and eight warps."""
    block_n, warps = {PLAIN: (2, 4), NORM: (4, 4), SILU: (2, 8)}[mode]
    return block_n, min(1024, k & -k), warps


def _launch(
    x: torch.Tensor, weight: torch.Tensor, mode: int, k: int, delta: torch.Tensor | None = None,
    norm: torch.Tensor | None = None, residual: torch.Tensor | None = None, eps: float = 0.0,
    block: tuple[int, int, int] | None = None,
) -> torch.Tensor:  # fmt: skip
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight {tuple(weight.shape)} does not take an input of {k}")
    out = x.new_empty(*x.shape[:-1], n)
    block_n, chunk, warps = block or config(mode, k)
    x = x.contiguous()
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, x if delta is None else delta.contiguous(), weight if norm is None else norm,
        x if residual is None else residual, weight, out, n, eps,
        K=k, KC=chunk, BLOCK_N=block_n, MODE=mode, HAS_DELTA=delta is not None, num_warps=warps,
    )  # fmt: skip
    return out


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T (no bias): the one-row kernel where it `fits`, else `F.linear`."""
    return matvec(x, weight) if fits(x, weight) else F.linear(x, weight)


def matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for one row x (..., K) with the kernel."""
    return _launch(x, weight, PLAIN, x.shape[-1])


def norm_linear(
    x: torch.Tensor, delta: torch.Tensor | None, norm: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm(x + delta) * norm @ weight.T) for one row; `delta` None: x itself."""
    residual = x if delta is None else torch.empty_like(x)
    return residual, _launch(x, weight, NORM, x.shape[-1], delta, norm, residual, eps)


def silu_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(SiLU(gate) * up) @ weight.T for one row, `gate_up` (..., 2I) holding gate then up."""
    return _launch(gate_up, weight, SILU, gate_up.shape[-1] // 2)
