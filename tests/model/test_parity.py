"""Our Qwen3-TTS against the official implementation on the same random weights (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.generate import generate_codes
from voxgate.engines.qwen3.prompt import PromptBuilder

pytestmark = pytest.mark.slow


def _template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def _official_codes(tts, text, *, language, speaker=None, instruct=None, stream_text=False, **gen):
    ids = tts.processor(text=_template(text), return_tensors="pt")["input_ids"]
    instruct_ids = None
    if instruct:
        instruct_ids = tts.processor(text=f"<|im_start|>user\n{instruct}<|im_end|>\n", return_tensors="pt")["input_ids"]
    codes, _ = tts.model.generate(
        input_ids=[ids],
        instruct_ids=[instruct_ids],
        languages=[language],
        speakers=[speaker],
        non_streaming_mode=not stream_text,
        repetition_penalty=1.05,
        **gen,
    )
    return codes[0]


def _our_codes(checkpoint, text, params, *, language, speaker=None, instruct=None, stream_text=False):
    builder = PromptBuilder(checkpoint.config, checkpoint.tokenizer, checkpoint.talker)
    prompt = builder.build(text, speaker=speaker, language=language, instruct=instruct, stream_text=stream_text)
    return torch.stack(list(generate_codes(checkpoint.talker, prompt, params)))


@pytest.mark.parametrize(
    "text",
    [
        "Hello world, this is a test.",
        "你好，世界！今天天气不错。",
        "Mixed 中文 and English, 3.14 & $5.",
        "  spaces\tand\nlines ",
    ],
)
def test_text_tokenizer_matches_official(ours, official, text):
    expected = official["cv06"].processor(text=_template(text), return_tensors="pt")["input_ids"][0].tolist()
    assert ours["cv06"].tokenizer.encode(_template(text), add_special_tokens=False).ids == expected


GREEDY_CASES = [
    ("cv06", "Hello world, this is a test.", {"language": "English", "speaker": "Vivian"}),
    ("cv06", "你好，世界！今天天气不错。", {"language": "Chinese", "speaker": "Eric"}),  # dialect speaker
    ("cv06", "Streaming text goes one token per frame.", {"language": "Auto", "speaker": "Ryan", "stream_text": True}),
    (
        "cv17",
        "A larger talker with an instruction.",
        {"language": "English", "speaker": "Serena", "instruct": "Speak happily."},
    ),
    ("vd17", "A designed voice speaks.", {"language": "English", "instruct": "A warm, low female voice."}),
]


@pytest.mark.parametrize(("model", "text", "kwargs"), GREEDY_CASES)
def test_greedy_codes_are_identical(ours, official, model, text, kwargs):
    expected = _official_codes(
        official[model], text, do_sample=False, subtalker_dosample=False, max_new_tokens=24, **kwargs
    )
    got = _our_codes(ours[model], text, SamplingParams.greedy(max_new_tokens=24), **kwargs)
    assert got.shape == expected.shape == (23, 16)
    assert torch.equal(got, expected)


def test_seeded_sampling_draws_identical_codes(ours, official):
    text, kwargs = "Sampling should match with the same seed.", {"language": "English", "speaker": "Serena"}
    torch.manual_seed(1234)
    expected = _official_codes(
        official["cv06"], text, do_sample=True, top_k=50, top_p=1.0, temperature=0.9, subtalker_dosample=True,
        subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9, max_new_tokens=20, **kwargs,
    )  # fmt: skip
    got = _our_codes(ours["cv06"], text, SamplingParams(seed=1234, max_new_tokens=20), **kwargs)
    assert torch.equal(got, expected)


def test_decoded_waveform_matches_official(ours, official):
    codes = torch.randint(0, 2048, (1, 16, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        expected = official["cv06"].model.speech_tokenizer.model.decoder(codes)[:, 0]
    got = ours["cv06"].codec.decode(codes)
    assert expected.std() > 0.01 and (expected.abs() >= 1).float().mean() < 0.01  # a real, unclipped signal
    assert ((got - expected).norm() / expected.norm()).item() < 1e-4


def _reference_audio(seconds: float = 1.5, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(24000 * seconds)) / 24000
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def test_speaker_embedding_matches_official(ours, official):
    wav = _reference_audio()
    expected = official["b06"].model.extract_speaker_embedding(wav, 24000)
    got = ours["b06"].speaker.embed(torch.from_numpy(wav))
    assert ((got - expected).norm() / expected.norm()).item() < 1e-5


def _official_clone_codes(tts, text, xvec, ref_codes=None, ref_text=None, stream_text=True):
    ids = tts.processor(text=_template(text), return_tensors="pt")["input_ids"]
    ref_ids = None
    if ref_text is not None:
        ref_ids = [
            tts.processor(text=f"<|im_start|>assistant\n{ref_text}<|im_end|>\n", return_tensors="pt")["input_ids"]
        ]
    prompt = {"ref_code": [ref_codes], "ref_spk_embedding": [xvec], "x_vector_only_mode": [ref_codes is None],
              "icl_mode": [ref_codes is not None]}  # fmt: skip
    codes, _ = tts.model.generate(input_ids=[ids], ref_ids=ref_ids, voice_clone_prompt=prompt, languages=["Auto"],
                                  non_streaming_mode=not stream_text, do_sample=False, subtalker_dosample=False,
                                  repetition_penalty=1.05, max_new_tokens=16)  # fmt: skip
    return codes[0]


def test_voice_clone_xvector_only_codes_are_identical(ours, official):
    xvec = ours["b06"].speaker.embed(torch.from_numpy(_reference_audio(seed=1)))
    text = "A cloned voice, x-vector only."
    expected = _official_clone_codes(official["b06"], text, xvec)
    builder = PromptBuilder(ours["b06"].config, ours["b06"].tokenizer, ours["b06"].talker)
    prompt = builder.build(text, speaker_embedding=xvec, stream_text=True)
    got = torch.stack(list(generate_codes(ours["b06"].talker, prompt, SamplingParams.greedy(max_new_tokens=16))))
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("ref_frames", "text", "ref_text", "stream_text"),
    [
        (13, "In context cloning.", "This is me speaking.", True),  # text shorter than the reference
        (4, "A much longer text than the reference has frames for.", "Hi.", True),
        (9, "Non streaming clone.", "Reference words here.", False),
    ],
)
def test_voice_clone_in_context_codes_are_identical(ours, official, ref_frames, text, ref_text, stream_text):
    xvec = torch.randn(ours["b06"].config.talker.stack.hidden_size, generator=torch.Generator().manual_seed(2))
    ref_codes = torch.randint(0, 2048, (ref_frames, 16), generator=torch.Generator().manual_seed(ref_frames))
    expected = _official_clone_codes(official["b06"], text, xvec, ref_codes, ref_text, stream_text)
    builder = PromptBuilder(ours["b06"].config, ours["b06"].tokenizer, ours["b06"].talker)
    prompt = builder.build(
        text, speaker_embedding=xvec, ref_codes=ref_codes, ref_text=ref_text, stream_text=stream_text
    )
    got = torch.stack(list(generate_codes(ours["b06"].talker, prompt, SamplingParams.greedy(max_new_tokens=16))))
    assert torch.equal(got, expected)


def test_generation_stops_at_eos_like_the_official(ours, official):
    """No random checkpoint emits the real EOS, so both sides are told that a code seen in a
    greedy run is EOS: generation must stop at that draw, and never in the first two draws."""
    from dataclasses import replace

    ck, tts = ours["cv06"], official["cv06"]
    text, kwargs = "Stop when told to.", {"language": "English", "speaker": "Vivian"}
    free = _our_codes(ck, text, SamplingParams.greedy(max_new_tokens=24), **kwargs)
    stop_at = next(k for k in range(2, len(free)) if int(free[k, 0]) not in free[:k, 0].tolist())
    eos = int(free[stop_at, 0])
    expected = _official_codes(tts, text, do_sample=False, subtalker_dosample=False, max_new_tokens=24,
                               eos_token_id=eos, **kwargs)  # fmt: skip
    original = ck.talker.cfg
    try:
        ck.talker.cfg = replace(original, codec_eos_id=eos)
        got = _our_codes(ck, text, SamplingParams.greedy(max_new_tokens=24), **kwargs)
    finally:
        ck.talker.cfg = original
    assert got.shape[0] == stop_at and torch.equal(got, expected)
