"""Our codec encoder against the official one (Mimi inside `Qwen3TTSTokenizerV2Model`) on the
same random weights: CPU, fp32, exact code equality."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from tests.model.conftest import _stub_unused_imports
from voxgate.engines.qwen3.checkpoint import TINY_CODEC, TINY_ENCODER, default_config_root, randomise
from voxgate.engines.qwen3.codec_encoder import CodecEncoder, CodecEncoderConfig

pytestmark = pytest.mark.slow

SHARED = default_config_root() / "Qwen3-TTS-12Hz-0.6B-CustomVoice"
RATE = 24000


def _codec_config() -> dict:
    return json.loads((SHARED / "speech_tokenizer" / "config.json").read_text())


def _tiny_codec_config() -> dict:
    raw = _codec_config()
    raw["encoder_config"].update(TINY_ENCODER)
    raw["decoder_config"].update(TINY_CODEC)
    return raw


def _official_model(raw: dict, device: str = "cpu"):
    _stub_unused_imports()
    pytest.importorskip("qwen_tts")
    from qwen_tts._transformers_compat import restore_mimi_full_attention
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    with torch.device(device):
        model = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**copy.deepcopy(raw)))
    # What `Qwen3TTSTokenizer.from_pretrained` does after loading: full causal attention.
    restore_mimi_full_attention(model)
    model.encoder.config._attn_implementation = "eager"
    return model.eval()


@pytest.fixture(scope="module")
def models():
    """(official Qwen3TTSTokenizerV2Model, our CodecEncoder) sharing random encoder weights."""
    raw = _tiny_codec_config()
    official = _official_model(raw)
    randomise(official.encoder, torch.Generator().manual_seed(11), layer_scale=0.5)
    ours = CodecEncoder(CodecEncoderConfig.from_dict(raw["encoder_config"]))
    ours.load_state_dict(official.encoder.state_dict(), strict=True)
    return official, ours.eval()


def _official_codes(official, wav: torch.Tensor) -> torch.Tensor:
    """(B, samples) -> (B, 16, frames) through the official top-level `encode` (its trimming included)."""
    with torch.inference_mode():
        out = official.encode(wav, torch.ones_like(wav, dtype=torch.long), return_dict=True)
    return torch.stack([codes.T for codes in out.audio_codes])


def _waveforms() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    t = torch.arange(2 * RATE) / RATE
    return {
        "noise_1s": 0.1 * torch.randn(1, RATE, generator=g),
        "noise_1.3s": 0.1 * torch.randn(1, int(1.3 * RATE), generator=g),
        "noise_3s_batch2": 0.1 * torch.randn(2, 3 * RATE, generator=g),
        "sine_2s": (0.5 * torch.sin(2 * math.pi * 220 * t))[None],
        # 300 frames at 25 Hz: past the config's 250-frame sliding window, so this pins full attention.
        "noise_12s": 0.1 * torch.randn(1, 12 * RATE, generator=g),
    }


WAVEFORMS = _waveforms()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(WAVEFORMS))
def test_codes_equal_official_encoder(models, name: str, attention: str) -> None:
    official, ours = models
    wav = WAVEFORMS[name]
    official.encoder.config._attn_implementation = attention
    try:
        expected = _official_codes(official, wav)
    finally:
        official.encoder.config._attn_implementation = "eager"
    got = ours.encode(wav)
    assert got.dtype == torch.int64
    assert got.shape == expected.shape == (wav.shape[0], 16, math.ceil(wav.shape[1] / 1920))
    mismatches = (got != expected).sum().item()
    assert mismatches == 0, f"{mismatches} of {got.numel()} codes differ"
    # Not a vacuous match: the random model spreads frames over many centroids per codebook.
    # (Codebook 0 varies least on stationary noise, so the bar is low per codebook, high overall.)
    assert min(len(row.unique()) for row in got.reshape(-1, got.shape[-1])) >= 3
    assert len(got.unique()) >= got.shape[-1]


@pytest.mark.parametrize("samples", [1, 1919, 1920, 1921, 24500])
def test_frame_count_is_ceil_of_samples_over_1920(models, samples: int) -> None:
    official, ours = models
    wav = 0.1 * torch.randn(1, samples, generator=torch.Generator().manual_seed(samples))
    got = ours.encode(wav)
    assert got.shape == (1, 16, -(-samples // 1920))
    assert torch.equal(got, _official_codes(official, wav))


def _set_window(official, window: int) -> None:
    official.encoder.config.sliding_window = window
    for module in official.encoder.modules():
        if hasattr(module, "sliding_window"):
            module.sliding_window = window


def test_full_attention_changes_codes_past_the_config_window(models) -> None:
    """The 12 s parity case only pins full attention if a 250-frame window would give other codes."""
    official, _ = models
    wav = WAVEFORMS["noise_12s"]
    full = _official_codes(official, wav)
    _set_window(official, 250)
    try:
        windowed = _official_codes(official, wav)
    finally:
        _set_window(official, official.encoder.config.max_position_embeddings)
    # Output frame j sees 25 Hz steps <= 2j + 1, so frames < 125 never reach past the window.
    assert torch.equal(full[..., :125], windowed[..., :125])
    assert not torch.equal(full, windowed)


@pytest.mark.parametrize("samples", [30000, 38400])
def test_right_padding_changes_only_the_last_partly_covered_frame(models, samples: int) -> None:
    """What batching reference clips of different lengths relies on."""
    _, ours = models
    wav = 0.1 * torch.randn(1, samples, generator=torch.Generator().manual_seed(samples))
    alone = ours.encode(wav)
    padded = ours.encode(torch.nn.functional.pad(wav, (0, 3 * RATE - samples)))[..., : alone.shape[-1]]
    whole = samples // 1920
    assert torch.equal(alone[..., :whole], padded[..., :whole])


def test_state_dict_matches_official_checkpoint_names_and_shapes() -> None:
    """Real-size config: our names, shapes and buffer/parameter split are the checkpoint's `encoder.*`."""
    raw = _codec_config()
    official = _official_model(raw, device="meta")
    expected = {
        k.removeprefix("encoder."): v.shape for k, v in official.state_dict().items() if k.startswith("encoder.")
    }
    with torch.device("meta"):
        ours = CodecEncoder(CodecEncoderConfig.from_dict(raw["encoder_config"]))
    assert {k: v.shape for k, v in ours.state_dict().items()} == expected
    assert {k for k, _ in ours.named_buffers()} == {k for k, _ in official.encoder.named_buffers() if k in expected}


def test_config_rejects_variants_the_encoder_does_not_implement() -> None:
    raw = _codec_config()["encoder_config"]
    assert CodecEncoderConfig.from_dict(raw).samples_per_frame == 1920
    for key, value in [("use_causal_conv", False), ("pad_mode", "reflect"), ("use_conv_shortcut", True)]:
        with pytest.raises(ValueError, match=key):
            CodecEncoderConfig.from_dict({**raw, key: value})
