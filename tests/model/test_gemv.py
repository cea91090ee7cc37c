"""The one-row matrix-vector kernels (`gemv.py`) against PyTorch. Without a GPU they run in
Triton's interpreter in float32 (tests/conftest.py sets it); on a GPU in bf16, as the step
runs them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
gemv = pytest.importorskip("voxgate.engines.qwen3.gemv")
kernels = pytest.importorskip("voxgate.engines.qwen3.kernels")
from voxgate.engines.qwen3.layers import Span  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOL = {"atol": 2e-2, "rtol": 2e-2} if DEVICE == "cuda" else {"atol": 1e-4, "rtol": 1e-4}


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, DTYPE)


@pytest.mark.parametrize(("n", "k"), [(96, 64), (100, 3072), (40, 160)])
def test_matvec_equals_the_product_for_any_rows_and_chunking(n, k):
    x, weight = _randn(1, 1, k), _randn(n, k, seed=1) / k**0.5
    out = gemv.matvec(x, weight)
    assert out.shape == (1, 1, n) and out.dtype == DTYPE
    torch.testing.assert_close(out.float(), (x.float() @ weight.float().T), **TOL)
    for block in [(1, 32, 4), (16, 32, 4), (4, k & -k, 8)]:  # every split gives the same sums' values
        torch.testing.assert_close(gemv._launch(x, weight, 0, k, block=block), out, **TOL)


@pytest.mark.parametrize("with_delta", [True, False])
def test_norm_linear_adds_the_residual_normalises_and_multiplies(with_delta):
    k, n = 128, 72
    x, delta, norm, weight = _randn(1, 1, k), _randn(1, 1, k, seed=1), _randn(k, seed=2), _randn(n, k, seed=3) / 11
    residual, out = gemv.norm_linear(x, delta if with_delta else None, norm, 1e-6, weight)
    expected_residual, normed = kernels.add_rms_norm(x, delta if with_delta else None, norm, 1e-6)
    assert torch.equal(residual, expected_residual)  # rounded as the unfused add rounds it
    torch.testing.assert_close(out.float(), normed.float() @ weight.float().T, **TOL)


def test_silu_linear_applies_silu_times_up_before_the_product():
    gate_up, weight = _randn(1, 1, 2 * 96), _randn(48, 96, seed=1) / 10
    expected = (F.silu(gate_up[..., :96].float()) * gate_up[..., 96:].float()).to(DTYPE).float() @ weight.float().T
    torch.testing.assert_close(gemv.silu_linear(gate_up, weight).float(), expected, **TOL)


def test_linear_uses_the_kernel_only_for_one_half_precision_row_on_a_gpu():
    weight = _randn(8, 16)
    assert not gemv.fits(_randn(2, 16), weight)  # two rows: cuBLAS
    assert not gemv.fits(torch.zeros(1, 16), torch.zeros(8, 16))  # float32 (and the CPU): cuBLAS
    assert gemv.fits(_randn(1, 16), weight) == (DEVICE == "cuda")
    torch.testing.assert_close(gemv.linear(_randn(3, 16), weight), F.linear(_randn(3, 16), weight))


def test_the_one_row_decoder_stack_equals_the_cublas_layers(ours):
    """A whole code-predictor stack (tiny checkpoint) through `_forward_one_row`: the hidden
    states and cache entries of `_forward_rows` (cuBLAS products, unfused norms) over three steps."""
    talker = ours["cv06"].talker
    stack = copy.deepcopy(talker.code_predictor.model).to(DEVICE, DTYPE)
    stack.fuse(positions=16, kernels=True)
    assert stack.rope_table is not None
    caches = [talker.new_predictor_cache(1) for _ in range(2)]
    for cache in caches:
        cache.k, cache.v = cache.k.to(DEVICE, DTYPE), cache.v.to(DEVICE, DTYPE)
    prefill = _randn(1, 2, stack.cfg.hidden_size, seed=4)
    for cache in caches:
        stack._forward_rows(prefill, cache, Span(stack.rope_table, 0, 2, None))
    for step in range(3):
        x = _randn(1, 1, stack.cfg.hidden_size, seed=5 + step)
        position = 2 + step
        span = Span(stack.rope_table, position, position + 1, None)
        one_row, rows = stack._forward_one_row(x, caches[0], span), stack._forward_rows(x, caches[1], span)
        torch.testing.assert_close(one_row.float(), rows.float(), **TOL)
        torch.testing.assert_close(caches[0].k.float(), caches[1].k.float(), **TOL)
        torch.testing.assert_close(caches[0].v.float(), caches[1].v.float(), **TOL)
