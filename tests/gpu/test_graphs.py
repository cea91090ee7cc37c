"""On a CUDA GPU: graph replay gives the same codes as the eager fixed-shape path (fp32, greedy)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_graph_replay_equals_eager_in_fp32(tmp_path):
    from pathlib import Path

    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint
    from voxgate.engines.qwen3.config import SamplingParams
    from voxgate.engines.qwen3.graphs import StaticDecoder
    from voxgate.engines.qwen3.loader import load_checkpoint
    from voxgate.engines.qwen3.prompt import PromptBuilder

    carried = Path(".gpu/qwen3-tts")  # the configs travel with the tree to the GPU machine
    root = carried if carried.is_dir() else None
    path = make_random_checkpoint("Qwen3-TTS-12Hz-0.6B-CustomVoice", tmp_path / "ck", tiny=True, config_root=root)
    ck = load_checkpoint(path, "cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    prompt = PromptBuilder(ck.config, ck.tokenizer, ck.talker).build("Graphs on the GPU.", speaker="ryan")
    params = SamplingParams.greedy(max_new_tokens=30)
    graphs = StaticDecoder(ck.talker, params, capacity=256, use_graphs=True)
    eager = StaticDecoder(ck.talker, params, capacity=256, use_graphs=False)
    assert graphs.stats.captured
    assert torch.equal(torch.stack(list(graphs.generate(prompt))), torch.stack(list(eager.generate(prompt))))
    assert graphs.stats.replays > 0


def test_codec_graph_streams_like_the_offline_decode(tmp_path):
    from pathlib import Path

    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint
    from voxgate.engines.qwen3.graphs import StaticCodecStep
    from voxgate.engines.qwen3.loader import load_checkpoint

    carried = Path(".gpu/qwen3-tts")
    root = carried if carried.is_dir() else None
    path = make_random_checkpoint("Qwen3-TTS-12Hz-0.6B-CustomVoice", tmp_path / "ck", tiny=True, config_root=root)
    codec = load_checkpoint(path, "cuda").codec
    codes = torch.randint(0, 2048, (1, 16, 23), device="cuda")
    offline = codec.decode(codes)
    for packet in (1, 4):
        graph = StaticCodecStep(codec, packet, use_graphs=True)
        eager = StaticCodecStep(codec, packet, use_graphs=False)
        streamed = torch.cat([graph.decode(codes[..., i : i + packet]) for i in range(0, 23, packet)], dim=-1)
        reference = torch.cat([eager.decode(codes[..., i : i + packet]) for i in range(0, 23, packet)], dim=-1)
        assert torch.equal(streamed, reference)  # replay == the same kernels run eagerly
        snr = 10 * torch.log10(offline.pow(2).sum() / (streamed - offline).pow(2).sum().clamp_min(1e-30))
        assert snr > 60, f"packet {packet}: SNR {snr:.1f} dB"  # fp32 GPU: streamed vs one-shot


def test_voice_clone_engine_starts_and_speaks_on_the_gpu(tmp_path):
    from pathlib import Path

    import numpy as np

    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint
    from voxgate.engines.qwen3.config import SamplingParams
    from voxgate.engines.qwen3.engine import Qwen3Engine
    from voxgate.engines.qwen3.loader import load_checkpoint
    from voxgate.types import CancelToken, SynthesisRequest

    carried = Path(".gpu/qwen3-tts")
    root = carried if carried.is_dir() else None
    path = make_random_checkpoint("Qwen3-TTS-12Hz-0.6B-Base", tmp_path / "ck", tiny=True, config_root=root)
    engine = Qwen3Engine(load_checkpoint(path, "cuda", torch.bfloat16), sampling=SamplingParams(max_new_tokens=6))
    engine.warmup()
    t = np.arange(24000) / 24000
    engine.add_voice("eve", (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 24000, "A reference.")
    request = SynthesisRequest(text="Hello.", voice="eve", seed=1)
    runs = [np.concatenate([c.samples for c in engine.stream(request, CancelToken())]) for _ in range(3)]
    assert len(runs[0]) == 5 * 1920
    assert all(np.array_equal(runs[0], r) for r in runs[1:])  # seeded graph mode is deterministic


def test_bf16_graph_mode_is_deterministic_and_streams_like_offline(tmp_path):
    """Issue 4's proofs in bf16: same seed -> identical PCM over 10 runs in graph mode, and the
    streamed packets against the one-shot decode of the same codes at SNR >= 60 dB."""
    import hashlib
    from pathlib import Path

    import numpy as np

    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint
    from voxgate.engines.qwen3.config import SamplingParams
    from voxgate.engines.qwen3.engine import Qwen3Engine
    from voxgate.engines.qwen3.loader import load_checkpoint
    from voxgate.types import CancelToken, SynthesisRequest

    carried = Path(".gpu/qwen3-tts")
    root = carried if carried.is_dir() else None
    path = make_random_checkpoint("Qwen3-TTS-12Hz-0.6B-CustomVoice", tmp_path / "ck", tiny=True, config_root=root)
    ck = load_checkpoint(path, "cuda", torch.bfloat16)
    engine = Qwen3Engine(ck, packet_frames=1, sampling=SamplingParams(max_new_tokens=25))
    request = SynthesisRequest(text="Deterministic graphs in bf16.", voice="serena", seed=11)
    digests = set()
    for _ in range(10):
        pcm = np.concatenate([c.samples for c in engine.stream(request, CancelToken())])
        digests.add(hashlib.sha256(pcm.tobytes()).hexdigest())
    assert len(digests) == 1 and engine.static is not None and engine.static.stats.replays > 0
    codes = torch.stack(list(engine.static.generate(engine.prompts.build(request.text, speaker="serena"), seed=11)))
    offline = ck.codec.decode(codes.T[None]).float()
    engine.codec_step.reset()
    streamed = torch.cat([engine.codec_step.decode(codes[i : i + 1].T[None]) for i in range(len(codes))], -1).float()
    snr = 10 * torch.log10(offline.pow(2).sum() / (streamed - offline).pow(2).sum().clamp_min(1e-30))
    assert snr >= 60, f"bf16 streamed vs offline SNR {snr:.1f} dB"
