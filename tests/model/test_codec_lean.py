"""The codec decoder's lean path (`CodecDecoder.set_lean`, VOXGATE_QWEN3_CODEC_LEAN): the same
PCM as the default path, packet by packet and row by row, from fewer operations."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from voxgate.bench.op_count import count_ops
from voxgate.engines.qwen3.batch import BatchDecoder
from voxgate.engines.qwen3.checkpoint import TINY_CODEC, randomise
from voxgate.engines.qwen3.codec import CodecDecoder, CodecDecoderConfig, DecoderState, SnakeBeta
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.loader import load_checkpoint
from voxgate.engines.qwen3.prompt import PromptBuilder

ATOL = 1e-6  # fp32 on the CPU: the lean path reorders no sum, so it is exact here; this is the stated bound


def _codes(rows: int, frames: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 2048, (rows, 16, frames), generator=torch.Generator().manual_seed(seed))


def _rows_state(codec: CodecDecoder, rows: int) -> DecoderState:
    """A static per-row state as BatchDecoder makes it."""
    state = DecoderState()
    with torch.no_grad():
        codec.decode(torch.zeros(rows, 16, 1, dtype=torch.long), state)
    state.freeze_rows(torch.device("cpu"), rows)
    return state


def _batched_pcm(codec: CodecDecoder, codes: torch.Tensor, held: dict[int, int]) -> torch.Tensor:
    """Frame by frame through a batched state; at step s, row held[s] (if any) does not move."""
    rows, _, frames = codes.shape
    state = _rows_state(codec, rows)
    out = []
    with torch.inference_mode():
        for t in range(frames):
            moving = torch.ones(rows, dtype=torch.bool)
            if t in held:
                moving[held[t]] = False
            out.append(codec.run(codes[:, :, t : t + 1], state.rows(rows, moving)))
    return torch.stack(out, dim=1)  # (rows, frames, samples)


def _lean(codec: CodecDecoder) -> CodecDecoder:
    lean = copy.deepcopy(codec)
    lean.set_lean(True)
    return lean


@pytest.fixture(scope="module")
def codecs(tiny_dirs):
    """The tiny 0.6B checkpoint's codec, default and lean (the lean one through the loader's flag)."""
    return load_checkpoint(tiny_dirs["cv06"]).codec, load_checkpoint(tiny_dirs["cv06"], codec_lean=True).codec


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_lean_codec_gives_the_default_pcm_frame_by_frame_in_a_batch(codecs, rows):
    default, lean = codecs
    assert lean.pre_transformer.lean and not default.pre_transformer.lean
    codes = _codes(rows, 6)
    held = {2: rows - 1, 4: 0}  # held rows keep their state and position, as in BatchDecoder
    expected = _batched_pcm(default, codes, held)
    got = _batched_pcm(lean, codes, held)
    assert expected.abs().max() > 1e-3  # real audio, not silence
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_the_lean_codec_gives_the_default_pcm_for_multi_frame_packets(codecs):
    default, lean = codecs
    codes = _codes(2, 9, seed=5)
    for packets in ([9], [4, 1, 4]):
        states = DecoderState(), DecoderState()
        start = 0
        for n in packets:
            chunk = codes[:, :, start : start + n]
            torch.testing.assert_close(
                lean.decode(chunk, states[1]), default.decode(chunk, states[0]), atol=ATOL, rtol=0
            )
            start += n


def test_the_fused_codec_gives_the_default_pcm_frame_by_frame_with_held_rows(codecs):
    """`CodecDecoder.fuse(kernels=True)` (the GPU's path: Snake and conv kernels, in Triton's
    interpreter here) through a batched static state with held rows: the default PCM up to
    fp32 sums in another order (the tiny codec's channels, 512 down to 32, all take the kernels)."""
    pytest.importorskip("triton")
    default = codecs[1]
    fused = copy.deepcopy(default)
    fused.fuse(kernels=True)
    codes = _codes(2, 3, seed=7)
    held = {1: 1}
    expected = _batched_pcm(default, codes, held)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(_batched_pcm(fused, codes, held), expected, atol=1e-4, rtol=0)


def test_the_folded_attention_scale_is_exact_at_head_dim_64():
    """head_dim 64 (the real codecs'): the lean path folds 1/8 into q's projection."""
    cfg = CodecDecoderConfig.from_dict(
        {**TINY_CODEC, "head_dim": 64, "num_attention_heads": 1, "num_key_value_heads": 1}
    )
    default = CodecDecoder(cfg)
    randomise(default, torch.Generator().manual_seed(1), quiet=(".conv1.", ".conv2.", "block.1.conv"))
    default.eval()
    lean = _lean(default)
    assert lean.pre_transformer.layers[0].self_attn._folded_scale() == 0.125
    codes = _codes(2, 4, seed=9)
    torch.testing.assert_close(_batched_pcm(lean, codes, {}), _batched_pcm(default, codes, {}), atol=ATOL, rtol=0)


def _count(codec: CodecDecoder, rows: int):
    state = _rows_state(codec, rows)
    view = state.rows(rows, torch.ones(rows, dtype=torch.bool))
    parts = {"pre_transformer": codec.pre_transformer, "decoder": list(codec.decoder)}
    with torch.no_grad(), count_ops(parts, {SnakeBeta: "activation"}, {"quantizer": (codec.quantizer, "decode")}) as n:
        codec.run(_codes(rows, 1), view)
    return n


@pytest.mark.parametrize("rows", [1, 8])
def test_the_lean_codec_issues_fewer_operations(codecs, rows):
    default, lean = codecs
    before, after = _count(default, rows), _count(lean, rows)
    assert before.total == _count(default, rows).total  # a count, not a timing: the same every run
    assert before.ops["quantizer"] - after.ops["quantizer"] >= 27  # 16 lookups + 15 adds -> offsets, lookup, sum
    layers = default.config.num_hidden_layers
    assert after.ops["pre_transformer"] <= before.ops["pre_transformer"] - 10 * layers
    assert after.ops["decoder"] < before.ops["decoder"]
    assert after.ops["activation"] == before.ops["activation"]  # the Snake activations are not touched
    assert after.total < before.total


def test_the_counter_gives_each_op_to_its_part_and_leaves_views_out():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), SnakeBeta(4))
    x = torch.randn(1, 4, 4)
    with torch.no_grad(), count_ops({"net": net}, {SnakeBeta: "activation"}) as n:
        net(x).transpose(1, 2).contiguous()  # transpose: a view; contiguous: 1 copy, outside the parts
    assert n.ops["net"] >= 1 and n.ops["activation"] >= 4 and n.ops["other"] == 1 and n.free["other"] >= 1
    assert not net[0]._forward_hooks and not net._forward_pre_hooks  # the hooks are gone


def test_a_batch_decoder_with_the_lean_codec_streams_the_same_audio(ours, codecs):
    ck = ours["cv06"]
    params = SamplingParams.greedy(max_new_tokens=20, min_new_tokens=20)
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    prompts = [builder.build(t, speaker="vivian", language="English") for t in ("Lean path.", "Same audio, too.")]
    pcm = []
    for codec in codecs:
        decoder = BatchDecoder(ck.talker, codec, slots=2, capacity=128)
        for i, prompt in enumerate(prompts):
            decoder.admit(i, prompt, params, 0)
        pcm.append(np.stack([decoder.step(2, [0, 1]).pcm[:2] for _ in range(6)]))
    assert np.abs(pcm[0]).max() > 1e-3
    np.testing.assert_allclose(pcm[1], pcm[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("which", [0, 1])
def test_the_codec_runs_channels_last_so_no_activation_reads_across_a_stride(codecs, which):
    """Every Snake activation gets its input contiguous with channels last (B, T, C): on a GPU the
    decoder ran channels first once, each layer transposing and Snake reading every channel with a
    stride of C, which cost a 128-row step 20 % (BENCHMARKS.md, 'The codec channels last')."""
    codec = codecs[which]
    seen: list[tuple[bool, int, int]] = []

    def check(module, given):
        seen.append((given[0].is_contiguous(), given[0].shape[-1], module.alpha.numel()))

    hooks = [m.register_forward_pre_hook(check) for m in codec.modules() if isinstance(m, SnakeBeta)]
    try:
        _batched_pcm(codec, _codes(2, 2), {})
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) == 3 * sum(isinstance(m, SnakeBeta) for m in codec.modules())  # the state's first decode + 2
    assert all(contiguous and last == channels for contiguous, last, channels in seen)


@pytest.mark.parametrize("fused", [False, True])
def test_a_conv_after_its_activation_needs_no_concatenation_and_gives_the_same_values(fused):
    """`CausalConv.activated`: the Snake written straight after the history (no torch.cat of
    the activation, the largest copy at the decoder's long steps), the same values as the
    activation then the conv, frame after frame (the history carried)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from voxgate.engines.qwen3.codec import CausalConv

    torch.manual_seed(0)
    act, conv = SnakeBeta(6), CausalConv(6, 5, 7, 3)
    with torch.no_grad():
        act.alpha.normal_(), act.beta.normal_()
    if fused:
        pytest.importorskip("triton")  # its interpreter on a CPU (tests/conftest.py)
    act.fused = conv.fused = fused  # 6 channels: the unfolded product even when fused

    class Cats(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Cats.n += func is torch.ops.aten.cat.default
            return func(*args, **(kwargs or {}))

    plain, direct = DecoderState(), DecoderState()
    with torch.no_grad():
        for frame in range(3):
            x = torch.randn(2, 4 * (frame + 1), 6)  # rows a multiple of 8: the CPU product pads no rows
            expected = conv(act(x), plain)
            with Cats():
                got = conv.activated(x, act, direct)
            assert torch.equal(got, expected), frame
    assert Cats.n == 0


def test_a_fused_conv_after_its_activation_streams_what_the_unfolded_one_gives():
    """`CausalConv.fused`: the conv as one implicit product over the [history | input] buffer
    (`kernels.conv_taps`, Triton's interpreter on a CPU) gives the unfolded product's values up
    to the order of the sum, frame after frame, and keeps the same history."""
    pytest.importorskip("triton")
    from voxgate.engines.qwen3.codec import CausalConv

    torch.manual_seed(0)
    act, conv = SnakeBeta(16), CausalConv(16, 5, 7, 3)
    with torch.no_grad():
        act.alpha.normal_(), act.beta.normal_()
    fused = copy.deepcopy(conv)
    fused.fused = True
    plain, direct = DecoderState(), DecoderState()
    with torch.no_grad():
        for frame in range(3):
            x = torch.randn(2, 4 * (frame + 1), 16)
            expected = conv.activated(x, act, plain)
            torch.testing.assert_close(fused.activated(x, act, direct), expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(direct.tensors[conv.key], plain.tensors[conv.key]), frame


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_direct_transposed_conv_is_the_concatenating_one_bit_for_bit(dtype):
    """`ops.transposed_conv(direct=True)` sums each output straight into its layout, in the same
    order as the path that concatenates the overlap first (kernel 2x and 1x the stride)."""
    from voxgate.engines.qwen3 import ops

    g = torch.Generator().manual_seed(4)
    for k, stride in ((10, 5), (4, 4)):
        x = torch.randn(2, 3, 6, generator=g).to(dtype)
        weight2d = torch.randn(5 * k, 6, generator=g).to(dtype)
        bias = torch.randn(5, generator=g).to(dtype)
        tail = torch.randn(2, 5, k - stride, generator=g).to(dtype)
        y, new_tail = ops.transposed_conv(x, tail, weight2d, bias, stride)
        y_direct, tail_direct = ops.transposed_conv(x, tail, weight2d, bias, stride, direct=True)
        assert torch.equal(y_direct, y) and torch.equal(tail_direct, new_tail), (k, stride)
