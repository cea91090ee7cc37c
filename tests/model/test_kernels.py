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
from voxgate.engines.qwen3.codec import DecoderState
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


def test_snake_writes_into_a_strided_buffer_tail_and_nowhere_else():
    x, alpha, inv_beta = _randn(3, 10, 7), _randn(7, seed=1).abs() + 0.5, _randn(7, seed=2).abs() + 0.5
    buffer = torch.full((3, 14, 7), 5.0, device=DEVICE)
    kernels.snake_beta(x, alpha, inv_beta, out=buffer[:, 4:])
    assert torch.equal(buffer[:, 4:], kernels.snake_beta(x, alpha, inv_beta))
    assert (buffer[:, :4] == 5.0).all()
    with pytest.raises(ValueError):
        kernels.snake_beta(x, alpha, inv_beta, out=buffer[:, 3:])


@pytest.mark.parametrize(
    ("rows", "steps", "c_in", "c_out", "taps", "dilation", "tiles"),
    [
        (3, 1, 32, 1, 7, 1, None),  # one step a row, one output channel (the codec's last conv)
        (2, 37, 48, 20, 7, 3, (32, 16, 16, 4, 1)),  # row blocks across rows, channel blocks, masked columns
        (1, 9, 16, 16, 3, 9, None),  # history longer than the input
        (2, 5, 32, 8, 1, 1, None),  # one tap: a plain product
    ],
)
def test_conv_taps_is_the_unfolded_conv(rows, steps, c_in, c_out, taps, dilation, tiles):
    span = (taps - 1) * dilation
    full = _randn(rows, span + steps, c_in)
    weight = _randn(c_out, c_in, taps, seed=1)
    bias = _randn(c_out, seed=2)
    expected, _ = ops.unfolded_conv(full, weight.reshape(c_out, -1), bias, taps, dilation)
    taps_form = weight.permute(2, 1, 0).reshape(-1, c_out).contiguous()
    got = kernels.conv_taps(full, taps_form, bias, taps, dilation, tiles)
    assert got.shape == (rows, steps, c_out)
    torch.testing.assert_close(
        got, expected, rtol=1e-5, atol=1e-4
    )  # another order: fp32 rounding of <= 336-term sums ~20 in size
    torch.testing.assert_close(
        kernels.conv_taps(full, taps_form, None, taps, dilation, tiles), expected - bias, rtol=1e-5, atol=1e-4
    )


def test_window_step_attends_like_window_attention_and_shifts_the_moving_rows_windows():
    """Rows at a stream's start (empty slots masked), mid-window and past it; two query heads a
    kv head; a held row keeps its window."""
    from voxgate.engines.qwen3.codec import valid_slots

    heads, kv, window, d = 4, 2, 9, 16
    qkv = _randn(3, heads + 2 * kv, 1, d)
    past = _randn(3, 2 * kv, window - 1, d, seed=1)
    position = torch.tensor([0, 3, 20], device=DEVICE)
    moving = torch.tensor([True, False, True], device=DEVICE)
    before = past.clone()
    got = kernels.window_step(qkv, past, position, moving, heads, 0.25)
    cache = torch.cat([before, qkv[:, heads:]], dim=2)
    state = DecoderState(tensors={}, position_t=position)
    blocked = ops.blocked_slots(valid_slots(state, window, 1, position.device), window)
    keys = cache[:, :kv].repeat_interleave(heads // kv, dim=1)
    values = cache[:, kv:].repeat_interleave(heads // kv, dim=1)
    expected = ops.window_attention(qkv[:, :heads], keys, values, None, window, 0.25, blocked=blocked)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(past[moving], cache[moving][:, :, 1:])
    assert torch.equal(past[1], before[1])
    with pytest.raises(ValueError):
        kernels.window_step(torch.cat([qkv, qkv], dim=2), past, position, None, heads, 0.25)


def test_conv_taps_refuses_a_weight_of_another_shape():
    with pytest.raises(ValueError):
        kernels.conv_taps(_randn(1, 10, 32), _randn(7 * 16, 4), None, 7, 1)


def test_silu_mul_and_snake_match_their_pytorch_forms():
    gate_up = _randn(2, 3, 80)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate_up[..., :40]) * gate_up[..., 40:])
    alpha, inv_beta = _randn(7).abs() + 0.5, _randn(7, seed=1).abs() + 0.5
    for x in (_randn(2, 50, 7), _randn(2, 7, 50).transpose(1, 2)):  # (B, T, C) contiguous, and strided
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


def _settings(n: int):
    from voxgate.engines.qwen3.fused_sampler import RowSettings

    do_sample = torch.tensor([True, True, False, True, True][:n], device=DEVICE)
    temperature = torch.tensor([[0.9], [1.0], [0.9], [0.5], [1.3]][:n], device=DEVICE)
    top_k = torch.tensor([50, 10, 50, 1, 30][:n], device=DEVICE)
    top_p = torch.tensor([1.0, 0.8, 1.0, 1.0, 0.5][:n], device=DEVICE)
    return RowSettings(do_sample, temperature, top_k, top_p)


@pytest.mark.parametrize("nucleus", [False, True])
def test_fused_sampler_draws_what_sample_rows_draws_and_gathers_the_embeddings(nucleus):
    from voxgate.engines.qwen3 import fused_sampler as fs
    from voxgate.engines.qwen3.sampling import hashed_gumbel, sample_rows

    b, v, width, h = 5, 2048, 50, 48
    logits = _randn(b, v)  # float32: no equal scores (bf16 has ties, whose order torch.topk leaves open)
    noise = hashed_gumbel(torch.arange(b, device=DEVICE), torch.arange(b * 16, device=DEVICE).view(b, 16), width)
    settings = _settings(b)
    # bf16 embeddings on the GPU; Triton's interpreter rounds float32 -> bf16 towards zero
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    table, earlier = _randn(v, h, seed=1).to(dtype), _randn(b, h, seed=2).to(dtype)
    codes = torch.zeros(b, 16, dtype=torch.long, device=DEVICE)
    following, frame = torch.zeros(b, 2, h, dtype=dtype, device=DEVICE), earlier.to(torch.float32, copy=True)
    fs.sample_codes(logits, noise[:, 3], settings, width, nucleus, codes[:, 5], table, following[:, 1], frame,
                    fs.FRAME_ADD)  # fmt: skip
    expected = sample_rows(logits.float(), noise[:, 3], *(getattr(settings, f) for f in settings.__slots__), width,
                           nucleus)  # fmt: skip
    assert torch.equal(codes[:, 5], expected) and not codes[:, :5].any() and not codes[:, 6:].any()
    assert torch.equal(following[:, 1], table[expected]) and not following[:, 0].any()
    assert torch.equal(frame, earlier.float() + table[expected].float())  # the sum stays float32
    if not nucleus:  # greedy rows take the best id; rows with top_k 1 too; equal scores: the lower id
        assert codes[2, 5] == logits[2].argmax() and codes[3, 5] == logits[3].argmax()
        logits[2, 7] = logits[2, 900] = logits[2].max() + 1
        fs.sample_codes(logits, noise[:, 3], settings, width, nucleus, codes[:, 5], table)
        assert codes[2, 5] == 7


@pytest.mark.parametrize("nucleus", [False, True])
def test_fused_sampler_ranks_equal_scores_by_lower_id_across_the_candidates_edge(nucleus):
    """bf16 logits tie often. The kernel's candidates are the `width` best by score, then by lower
    id, also where a run of equal scores straddles the width-th place (its radix select takes the
    lowest ids of that run); the reference: sample_rows in float64 with each score lowered by
    id * 1e-9, which orders ties by lower id and no distinct scores differently (steps of 1/8)."""
    from voxgate.engines.qwen3 import fused_sampler as fs
    from voxgate.engines.qwen3.sampling import hashed_gumbel, sample_rows

    b, v, width, h = 5, 2048, 50, 16
    logits = (_randn(b, v) * 8).round() / 8  # ~130 distinct values a row: runs of equal scores
    logits[0, 100:130] = 4.125  # the 30 best, then a run of 200 equal scores across the 50th place
    logits[0, 300:500] = 4.0
    logits[1, :] = -1.0  # every score equal: the lowest ids are the candidates
    logits[4, 7::9] = float("-inf")  # suppressed ids (the talker's control ids)
    noise = hashed_gumbel(torch.arange(b, device=DEVICE), torch.arange(b * 16, device=DEVICE).view(b, 16), width)
    settings = _settings(b)
    table = _randn(v, h, seed=1)
    codes = torch.zeros(b, dtype=torch.long, device=DEVICE)
    fs.sample_codes(logits, noise[:, 3], settings, width, nucleus, codes, table)
    lowered = logits.double() - torch.arange(v, device=DEVICE, dtype=torch.float64) * 1e-9
    fields = [getattr(settings, f) for f in settings.__slots__]
    fields[1] = fields[1].double()
    expected = sample_rows(lowered, noise[:, 3].double(), *fields, width, nucleus)
    assert torch.equal(codes, expected)
    assert codes[2] == logits[2].argmax() == lowered[2].argmax()  # a greedy row: the lowest id of the best
    assert 100 <= codes[0] < 130 or 300 <= codes[0] < 320
    assert codes[1] < 10  # top_k 10


def test_fused_sampler_applies_the_talker_processors_and_adds_the_text_row():
    from voxgate.engines.qwen3 import fused_sampler as fs
    from voxgate.engines.qwen3.sampling import batched_talker_scores, control_mask, hashed_gumbel, sample_rows

    b, v, width, h, eos = 4, 3072, 50, 40, 2150
    logits = _randn(b, v) * 4
    logits[:, eos] = 40.0  # EOS would win where it is not blocked
    seen = torch.rand(b, v, generator=torch.Generator().manual_seed(3)).to(DEVICE) < 0.3
    penalty = torch.tensor([[1.05], [1.3], [1.0], [2.0]], device=DEVICE)
    draws, min_new = torch.tensor([0, 5, 1, 7], device=DEVICE), torch.tensor([2, 2, 2, 2], device=DEVICE)
    control = control_mask(v, 2048, eos, torch.device(DEVICE))
    noise = hashed_gumbel(torch.arange(b, device=DEVICE), torch.arange(b * 16, device=DEVICE).view(b, 16), width)
    settings = _settings(b)
    is_eos = torch.zeros(v, dtype=torch.bool, device=DEVICE)
    is_eos[eos] = True
    scores = batched_talker_scores(logits, seen, penalty, draws < min_new, is_eos, control)
    expected = sample_rows(scores, noise[:, 0], *(getattr(settings, f) for f in settings.__slots__), width, False)
    assert expected.tolist()[1] == eos and expected.tolist()[0] != eos  # the test covers both cases
    table = _randn(v, h, seed=4)
    trailing, length, pad = _randn(b, 6, h, seed=5), torch.tensor([3, 9, 0, 8], device=DEVICE), _randn(h, seed=6)
    codes, frame, out = (
        torch.zeros(b, dtype=torch.long, device=DEVICE),
        torch.zeros(b, h, device=DEVICE),
        torch.zeros(b, h, device=DEVICE),
    )
    marked = seen.clone()
    held = next(r for r in range(b) if not seen[r, expected[r]])  # its draw would be news to its history
    moving = torch.ones(b, dtype=torch.long, device=DEVICE)
    moving[held] = 0  # held: its history stays as it was
    fs.sample_codes(logits, noise[:, 0], settings, width, False, codes, table, None, frame, fs.FRAME_SET,
                    talker=fs.TalkerScores(marked, penalty, draws, min_new, control, eos, moving),
                    text=fs.TextRows(trailing, length, draws, pad, out))  # fmt: skip
    assert torch.equal(codes, expected) and torch.equal(frame, table[expected])
    recorded = seen.scatter(1, expected[:, None], True)
    recorded[held] = seen[held]
    assert torch.equal(marked, recorded)
    rows = trailing[torch.arange(b, device=DEVICE), draws.clamp(max=5)]
    text = torch.where((draws < length)[:, None], rows, pad)
    assert torch.equal(out, table[expected] + text)


def test_the_fused_sampler_draws_the_seeded_codes_of_the_pytorch_sampler(ours):
    """fp32, sampled: the batched decoder on the fused kernels draws the same codes with its
    fused sampler as with the PyTorch sampler (same seeds, same counter-based noise)."""
    ck = ours["cv06"]
    if DEVICE == "cuda":
        pytest.skip("tests/gpu covers the fused sampler in the decoder on the GPU")
    fused = copy.deepcopy(ck.talker)
    fused.fuse(kernels=True)
    prompt = PromptBuilder(ck.config, ck.tokenizer, ck.talker).build("Seeded draws.", speaker="vivian")
    params = SamplingParams(max_new_tokens=10, min_new_tokens=10)
    runs = []
    for with_kernel in (True, False):
        decoder = BatchDecoder(fused, ck.codec, slots=2, capacity=64)
        assert decoder.fused_sampler
        decoder.fused_sampler = with_kernel
        decoder.admit(1, prompt, params, seed=3)
        runs.append(torch.stack([torch.from_numpy(decoder.step(2, [1]).codes[1]) for _ in range(2)]))
    assert torch.equal(runs[0], runs[1])


def test_a_frame_embedding_in_bf16_is_summed_in_float32_and_rounded_once(ours):
    """As the official implementation's `torch.sum` of the 16 embeddings: a bf16 sum rounded
    after every add drifts (it put code 0's KL against fp32 at 1.07-1.10x the official bf16's)."""
    talker = copy.deepcopy(ours["cv06"].talker).to(torch.bfloat16)
    tables = [talker.model.codec_embedding, *talker.code_predictor.model.codec_embedding]
    codes = torch.randint(0, 2048, (8, 16), generator=torch.Generator().manual_seed(0))
    rows = torch.stack([table(codes[:, i]) for i, table in enumerate(tables)], dim=1)  # (8, 16, H) bf16
    once = rows.float().sum(1).to(torch.bfloat16)
    stepwise = rows[:, 0]
    for i in range(1, 16):
        stepwise = stepwise + rows[:, i]
    assert not torch.equal(stepwise, once)  # the two roundings differ on these codes: the test can tell
    assert torch.equal(talker.frame_embedding(codes), once)
