"""The fixed-shape decode path (what the CUDA graphs capture), run eagerly on the CPU."""

from __future__ import annotations

import torch

from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.generate import generate_codes
from voxgate.engines.qwen3.graphs import StaticDecoder, gumbel_pick
from voxgate.engines.qwen3.prompt import PromptBuilder


def _prompt(ck, text="Fixed shapes, same codes.", **kw):
    return PromptBuilder(ck.config, ck.tokenizer, ck.talker).build(text, speaker="vivian", language="English", **kw)


def test_fixed_shape_greedy_codes_equal_the_dynamic_path(ours):
    ck = ours["cv06"]
    params = SamplingParams.greedy(max_new_tokens=20)
    for stream_text in (False, True):
        prompt = _prompt(ck, stream_text=stream_text)
        expected = torch.stack(list(generate_codes(ck.talker, prompt, params)))
        static = StaticDecoder(ck.talker, params, capacity=128)
        assert torch.equal(torch.stack(list(static.generate(prompt))), expected)
        assert torch.equal(torch.stack(list(static.generate(prompt))), expected)  # the cache is reused cleanly


def test_fixed_shape_sampling_is_seeded(ours):
    ck = ours["cv06"]
    static = StaticDecoder(ck.talker, SamplingParams(max_new_tokens=15), capacity=128)
    prompt = _prompt(ck)
    first = torch.stack(list(static.generate(prompt, seed=9)))
    assert torch.equal(first, torch.stack(list(static.generate(prompt, seed=9))))
    assert not torch.equal(first, torch.stack(list(static.generate(prompt, seed=10))))


def test_gumbel_max_draws_follow_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [gumbel_pick(logits, torch.rand(1, 4, generator=generator), 1.0, 0) for _ in range(20000)]
    ).flatten()
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(freq, torch.softmax(logits[0], dim=0), atol=0.015)
    top2 = torch.stack([gumbel_pick(logits, torch.rand(1, 4, generator=generator), 1.0, 2) for _ in range(2000)])
    assert set(top2.flatten().tolist()) <= {0, 1}


def test_static_codec_step_streams_exactly_like_the_offline_decode(ours):
    from voxgate.engines.qwen3.graphs import StaticCodecStep

    codec = ours["cv06"].codec
    codes = torch.randint(0, 2048, (1, 16, 23), generator=torch.Generator().manual_seed(21))
    offline = codec.decode(codes)
    step = StaticCodecStep(codec, packet=2, use_graphs=False)
    for _ in range(2):  # a second stream after reset() is just as exact
        streamed = torch.cat([step.decode(codes[..., i : i + 2]) for i in range(0, 23, 2)], dim=-1)
        assert torch.equal(streamed, offline)
        step.reset()
