"""Talker (codebook 0, one step per 80 ms frame) and code predictor (codebooks 1..15).

Module and parameter names mirror the official checkpoint under the `talker.` prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxgate.engines.qwen3 import gemv
from voxgate.engines.qwen3.config import TalkerConfig
from voxgate.engines.qwen3.layers import DecoderStack, KVCache


class TalkerModel(DecoderStack):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__(cfg.stack)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.stack.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class TextProjection(nn.Module):
    """Text embedding (text_hidden) -> talker hidden: Linear, SiLU, Linear."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden)
        self.linear_fc2 = nn.Linear(text_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class PredictorModel(DecoderStack):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__(cfg.predictor)
        # Embeddings of codebooks 1..15 live in the *talker* width: they also feed the talker input.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.predictor_vocab_size, cfg.stack.hidden_size) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.model = PredictorModel(cfg)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.predictor.hidden_size, cfg.predictor_vocab_size, bias=False)
            for _ in range(cfg.num_code_groups - 1)
        )
        width, small = cfg.stack.hidden_size, cfg.predictor.hidden_size
        self.small_to_mtp_projection: nn.Module = nn.Linear(width, small) if width != small else nn.Identity()


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.stack.hidden_size)
        self.codec_head = nn.Linear(cfg.stack.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)

    def fuse(self, kernels: bool = False) -> None:
        """The GPU fast path of both decoder stacks (see `layers`), with the fused Triton
        kernels when `kernels`."""
        self.model.fuse(kernels=kernels)
        self.code_predictor.model.fuse(positions=self.cfg.num_code_groups + 1, kernels=kernels)

    def text(self, ids: torch.Tensor) -> torch.Tensor:
        """Projected text embeddings for token ids (..., L) -> (..., L, hidden)."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of frames `codes` (B, 16) -> (B, hidden), added in
        float32 and rounded once to the model's dtype, as the official implementation's
        `torch.sum` of the stacked embeddings is (a bf16 sum rounded after each of the 15 adds
        put code 0's KL against fp32 at 1.07-1.10x the official bf16's, BENCHMARKS issue 22)."""
        first = self.model.codec_embedding(codes[:, 0])
        total = first.float()
        for i, table in enumerate(self.code_predictor.model.codec_embedding):
            total = total + table(codes[:, i + 1]).float()
        return total.to(first.dtype)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        p = self.codec_head.weight
        return KVCache(self.cfg.stack, batch, capacity, p.dtype, p.device)

    def new_predictor_cache(self, batch: int) -> KVCache:
        p = self.codec_head.weight
        return KVCache(self.cfg.predictor, batch, self.cfg.num_code_groups, p.dtype, p.device)

    def step(self, embeds: torch.Tensor, cache: KVCache, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run positions start..; return (last final-normed hidden (B, H), codebook-0 logits (B, V))."""
        hidden = self.model(embeds, cache, start)[:, -1]
        if self.model.kernels:
            return hidden, gemv.linear(hidden, self.codec_head.weight).float()
        return hidden, self.codec_head(hidden).float()
