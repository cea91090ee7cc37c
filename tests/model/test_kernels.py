"""The fused Triton kernels of the GPU fast path (`kernels.py`) against the PyTorch ops they
replace. Without a GPU they run in Triton's interpreter (tests/conftest.py sets it), so the
CPU suite checks their logic: indexing, masking, per-row positions, cache writes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from voxgate.engines.qwen3 import ops
from voxgate.engines.qwen3.batch import BatchDecoder
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.generate import generate_codes
from voxgate.engines.qwen3.prompt import PromptBuilder

pytest.importorskip("triton")
kernels = pytest.importorskip("voxgate.engines.qwen3.kernels")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def test_add_rms_norm_adds_the_residual_and_normalises():
    x, delta, weight = _randn(3, 5, 96), _randn(3, 5, 96, seed=1), _randn(96, seed=2)
    residual, normed = kernels.add_rms_norm(x, delta, weight, 1e-6)
    assert torch.equal(residual, x + delta)
    torch.testing.assert_close(normed, F.rms_norm(x + delta, (96,), weight, 1e-6))
    same, normed = kernels.add_rms_norm(x, None, weight, 1e-6)
    assert same is not None and torch.equal(same, x)
    torch.testing.assert_close(normed, F.rms_norm(x, (96,), weight, 1e-6))


@pytest.mark.parametrize("start", [4, "per-row"])
def test_qk_norm_rope_store_writes_each_rows_keys_at_its_position(start):
    b, t, h, kv, d, capacity, layers = 2, 3, 4, 2, 16, 12, 3
    qkv, weight = _randn(b, t, (h + 2 * kv) * d), _randn(h + kv, d, seed=1)
    cos, sin = (table.to(DEVICE) for table in ops.rope_tables(d, 10000.0, 64))
    k_cache = torch.zeros(layers, b, kv, capacity, d, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    starts = [4, 4] if start == 4 else [1, 6]
    positions = start if start == 4 else torch.tensor(starts, device=DEVICE)
    q = kernels.qk_norm_rope_store(qkv, weight, cos, sin, k_cache[1], v_cache[1], h, kv, 1e-6, positions)
    qk = F.rms_norm(qkv[..., : (h + kv) * d].view(b, t, h + kv, d), (d,), eps=1e-6) * weight
    v = qkv[..., (h + kv) * d :].view(b, t, kv, d)
    for row, s in enumerate(starts):
        expected = ops.apply_rope(qk[row].transpose(0, 1), cos[s : s + t], sin[s : s + t])  # (heads, T, D)
        torch.testing.assert_close(q[row], expected[:h])
        torch.testing.assert_close(k_cache[1, row, :, s : s + t], expected[h:])
        assert torch.equal(v_cache[1, row, :, s : s + t], v[row].transpose(0, 1))
    written = torch.zeros(capacity, dtype=torch.bool)
    written[starts[0] : starts[0] + t] = True
    assert not k_cache[0].any() and not k_cache[2].any() and not k_cache[1, 0, :, ~written].any()


def test_silu_mul_and_snake_match_their_pytorch_forms():
    gate_up = _randn(2, 3, 80)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate_up[..., :40]) * gate_up[..., 40:])
    alpha, inv_beta = _randn(7).abs() + 0.5, _randn(7, seed=1).abs() + 0.5
    for x in (_randn(2, 7, 50), _randn(2, 50, 7).transpose(1, 2)):  # contiguous and channels-last input
        torch.testing.assert_close(kernels.snake_beta(x, alpha, inv_beta), ops.snake_beta(x, alpha, inv_beta))


def test_the_talker_on_fused_kernels_draws_the_reference_codes(ours):
    """fp32 greedy: the whole fast path (one-stream prefill and steps, and the batched
    fixed-shape step at a per-row position) draws exactly the reference path's codes."""
    ck = ours["cv06"]
    if DEVICE == "cuda":
        pytest.skip("the GPU suite covers the fused talker on the GPU")
    fused = copy.deepcopy(ck.talker)
    fused.fuse(kernels=True)
    assert fused.model.kernels and fused.code_predictor.model.kernels
    prompt = PromptBuilder(ck.config, ck.tokenizer, ck.talker).build("Fused kernels.", speaker="ryan")
    params = SamplingParams.greedy(max_new_tokens=10, min_new_tokens=10)
    expected = torch.stack(list(generate_codes(ck.talker, prompt, params)))[:2]
    assert torch.equal(torch.stack(list(generate_codes(fused, prompt, params)))[:2], expected)
    batched = BatchDecoder(fused, ck.codec, slots=2, capacity=64)
    batched.admit(1, prompt, params, seed=0)
    codes = [torch.from_numpy(batched.step(2, [1]).codes[1]) for _ in range(2)]
    assert torch.equal(torch.stack(codes), expected)
