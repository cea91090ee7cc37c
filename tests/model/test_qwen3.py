"""Our Qwen3-TTS on its own: streaming equals offline, determinism, typed errors."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from voxgate.engines.base import collect
from voxgate.engines.qwen3.codec import DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.engine import Qwen3Engine
from voxgate.engines.qwen3.generate import max_frames_for
from voxgate.engines.qwen3.loader import CheckpointError, load_checkpoint
from voxgate.engines.qwen3.prompt import PromptBuilder, TextTable
from voxgate.types import CancelToken, EmptyText, InvalidRequest, SynthesisRequest, UnknownVoice, UnsupportedLanguage

# Streamed and one-shot decoding do the same sums over matrices of different widths (frames per
# call), and a float32 GEMM may round them differently by shape: MKL on an AVX-512 CPU differs by
# up to 3e-7 (5.7e-7 relative; bit-identical with MKL_CBWR=COMPATIBLE), where packets decoded
# without their left context are off by 0.25. Equal to 1e-5, as test_batch.py holds batched PCM.
PCM_ATOL = 1e-5


@pytest.mark.parametrize("packet", [1, 2, 4, 3, 7])
def test_incremental_decode_equals_one_shot_to_float_rounding(ours, packet):
    codec = ours["cv06"].codec
    frames = 23  # odd, and longer than a few packets
    codes = torch.randint(0, 2048, (1, 16, frames), generator=torch.Generator().manual_seed(packet))
    offline = codec.decode(codes)
    state = DecoderState()
    streamed = torch.cat([codec.decode(codes[..., i : i + packet], state) for i in range(0, frames, packet)], dim=-1)
    assert streamed.shape == offline.shape == (1, frames * 1920)
    torch.testing.assert_close(streamed, offline, rtol=0, atol=PCM_ATOL)


def test_decoder_window_reaches_past_the_attention_window(ours):
    """Frames beyond the 72-frame sliding window still stream the same audio (the KV window rolls)."""
    codec = ours["cv06"].codec
    codes = torch.randint(0, 2048, (1, 16, 90), generator=torch.Generator().manual_seed(11))
    state = DecoderState()
    streamed = torch.cat([codec.decode(codes[..., i : i + 5], state) for i in range(0, 90, 5)], dim=-1)
    torch.testing.assert_close(streamed, codec.decode(codes), rtol=0, atol=PCM_ATOL)


def _engine(ours, packet_frames=1, seed_sampling=True):
    params = SamplingParams(max_new_tokens=30) if seed_sampling else SamplingParams.greedy(max_new_tokens=30)
    return Qwen3Engine(ours["cv06"], packet_frames=packet_frames, sampling=params)


def test_engine_packets_equal_the_offline_decode_of_the_same_codes(ours):
    engine = _engine(ours, packet_frames=2, seed_sampling=False)
    request = SynthesisRequest(text="Packets of two frames.", voice="vivian", language="en")
    chunks = list(engine.stream(request, CancelToken()))
    assert all(len(c.samples) == 2 * 1920 for c in chunks[:-1])
    ck = ours["cv06"]
    prompt = PromptBuilder(ck.config, ck.tokenizer, ck.talker).build(request.text, speaker="vivian", language="english")
    from voxgate.engines.qwen3.generate import generate_codes

    codes = torch.stack(list(generate_codes(ck.talker, prompt, SamplingParams.greedy(max_new_tokens=30))), dim=1)
    offline = ck.codec.decode(codes[None])[0].numpy()
    np.testing.assert_allclose(np.concatenate([c.samples for c in chunks]), offline, rtol=0, atol=PCM_ATOL)


def test_same_seed_gives_identical_pcm_run_after_run(ours):
    # Three runs, not ten: each is 30 eager frames (about 80 ms a frame beside stress-ng on two
    # cores), and ten plus one came near the 300 s per-test limit on a loaded machine.
    engine = _engine(ours)
    request = SynthesisRequest(text="Deterministic sampling.", voice="serena", seed=42)
    digests = {hashlib.sha256(collect(engine, request).samples.tobytes()).hexdigest() for _ in range(3)}
    assert len(digests) == 1
    other = collect(engine, SynthesisRequest(text="Deterministic sampling.", voice="serena", seed=43))
    assert hashlib.sha256(other.samples.tobytes()).hexdigest() not in digests


def test_cancel_stops_generation_between_frames(ours):
    engine = _engine(ours)
    token = CancelToken()
    stream = engine.stream(SynthesisRequest(text="Stop me early please.", voice="ryan", seed=1), token)
    next(stream)
    token.cancel()
    assert len(list(stream)) <= 1


def test_length_guard_bounds_frames_for_short_texts():
    params = SamplingParams(max_new_tokens=8192)
    assert max_frames_for(2, params) == 64
    assert max_frames_for(100, params) == 800
    assert max_frames_for(5000, params) == 8192


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"text": "hi", "speaker": "nobody"}, UnknownVoice),
        ({"text": "hi", "speaker": "vivian", "language": "Klingon"}, UnsupportedLanguage),
        ({"text": "   ", "speaker": "vivian"}, EmptyText),
    ],
)
def test_prompt_errors_are_typed(ours, kwargs, error):
    ck = ours["cv06"]
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    with pytest.raises(error):
        builder.build(**kwargs)
    with pytest.raises(error):
        builder.plan(**kwargs)


PLAN_CASES = [
    ("cv06", "Hello world, this is a test.", {"language": "english", "speaker": "vivian"}),
    ("cv06", "你好，世界！今天天气不错。", {"language": "chinese", "speaker": "eric"}),  # dialect speaker
    ("cv06", "Streaming text goes one token per frame.", {"speaker": "Ryan", "stream_text": True}),
    ("cv06", "\n\nA leading newline.", {"speaker": "aiden", "language": "auto"}),
    ("cv17", "A larger talker with an instruction.", {"speaker": "serena", "instruct": "Speak happily."}),
    ("vd17", "A designed voice speaks.", {"language": "english", "instruct": "A warm, low female voice."}),
    ("vd17", "Designed, streamed.", {"instruct": "Calm.", "stream_text": True}),
]


@pytest.mark.parametrize(("model", "text", "kwargs"), PLAN_CASES)
def test_a_prompt_plan_embeds_to_the_prompt_build_makes(ours, model, text, kwargs):
    """The two forms of a prompt (prompt.py) keep the same rows in the same order: the plan's
    embeddings from the text table equal `build`'s (fp32, up to the rounding of the table's
    larger matrix products)."""
    ck = ours[model]
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    built, plan = builder.build(text, **kwargs), builder.plan(text, **kwargs)
    table = TextTable(ck.talker)
    made = table.prompts([plan, plan])  # two at once: each its own rows
    assert plan.length == built.length and plan.trailing_rows == built.trailing_rows
    assert plan.text_tokens == built.text_tokens
    for prompt in made:
        for ours_t, theirs in (
            (prompt.embeds, built.embeds),
            (prompt.trailing, built.trailing),
            (prompt.pad, built.pad),
        ):
            assert ours_t.shape == theirs.shape
            torch.testing.assert_close(ours_t, theirs, rtol=1e-5, atol=1e-5)


def test_voice_design_needs_instructions(ours):
    engine = Qwen3Engine(ours["vd17"], sampling=SamplingParams.greedy(max_new_tokens=5))
    assert [v.id for v in engine.voices()] == ["design"]
    with pytest.raises(InvalidRequest):
        list(engine.stream(SynthesisRequest(text="No description.", voice="design"), CancelToken()))


def test_loader_reports_missing_files(tiny_dirs, tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dirs["cv06"], broken)
    (broken / "speech_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing speech_tokenizer/model\.safetensors"):
        load_checkpoint(broken)


def test_loader_reports_mismatched_shapes(tiny_dirs, tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(tiny_dirs["cv06"], wrong)
    config = json.loads((wrong / "config.json").read_text())
    config["talker_config"]["intermediate_size"] = 512
    (wrong / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="wrong shape"):
        load_checkpoint(wrong)


def test_loader_reports_an_unreadable_config(tiny_dirs, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dirs["cv06"], bad)
    (bad / "config.json").write_text(json.dumps({"talker_config": {}}))
    with pytest.raises(CheckpointError, match="unreadable config"):
        load_checkpoint(bad)


def test_leading_newlines_do_not_break_the_prompt(ours):
    ck = ours["cv06"]
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    plain = builder.build("Hello there.", speaker="vivian")
    newline = builder.build("\n\nHello there.", speaker="vivian")
    assert torch.equal(plain.embeds, newline.embeds)


def test_instructions_are_ignored_by_the_0_6b_custom_voice_model(ours):
    engine = _engine(ours)
    plain = collect(engine, SynthesisRequest(text="Same either way.", voice="aiden", seed=4))
    instructed = collect(
        engine, SynthesisRequest(text="Same either way.", voice="aiden", seed=4, instructions="Shout!")
    )
    assert np.array_equal(plain.samples, instructed.samples)
