"""Frame-by-frame code generation: the talker picks codebook 0, the code predictor the
other 15, and the frame's summed embedding (plus the next text row) is the talker's next
input. A lazy generator: each `next()` does one frame of work.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.prompt import Prompt
from voxgate.engines.qwen3.sampling import control_mask, pick, talker_scores
from voxgate.engines.qwen3.talker import Talker
from voxgate.types import CancelToken


def max_frames_for(text_tokens: int, params: SamplingParams, per_token: int = 8, floor: int = 64) -> int:
    """Length guard: a text of n tokens gets at most max(floor, per_token * n) frames (and never
    more than max_new_tokens), so a short text cannot run away for minutes of audio."""
    return min(params.max_new_tokens, max(floor, per_token * text_tokens))


@torch.inference_mode()
def generate_codes(
    talker: Talker,
    prompt: Prompt,
    params: SamplingParams,
    cancel: CancelToken | None = None,
    max_new_tokens: int | None = None,
) -> Iterator[torch.Tensor]:
    """Yield one frame at a time as a (16,) int64 tensor of codes; stops at EOS, at
    `max_new_tokens` code-0 draws (the last draw yields no frame, as in the reference), or on cancel."""
    cfg = talker.cfg
    limit = max_new_tokens if max_new_tokens is not None else params.max_new_tokens
    device = prompt.embeds.device
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(params.seed)
    control = control_mask(cfg.vocab_size, cfg.predictor_vocab_size, cfg.codec_eos_id, device)
    cache = talker.new_cache(1, prompt.embeds.shape[1] + limit + 1)
    hidden, logits = talker.step(prompt.embeds, cache, 0)
    position = prompt.embeds.shape[1]
    history = torch.zeros(1, 0, dtype=torch.long, device=device)
    for draw in range(limit):
        if cancel is not None and cancel.cancelled:
            return
        scores = talker_scores(
            logits, history, draw, params.repetition_penalty, params.min_new_tokens, cfg.codec_eos_id, control
        )
        code0 = pick(scores, params.do_sample, params.temperature, params.top_k, params.top_p, generator)
        if int(code0) == cfg.codec_eos_id or draw == limit - 1:
            return
        history = torch.cat([history, code0[:, None]], dim=1)
        frame = predict_rest(talker, hidden, code0, params, generator)
        yield frame[0]
        row = prompt.trailing[:, draw] if draw < prompt.trailing.shape[1] else prompt.pad
        embeds = (talker.frame_embedding(frame) + row)[:, None]
        hidden, logits = talker.step(embeds, cache, position)
        position += 1


def predict_rest(
    talker: Talker, hidden: torch.Tensor, code0: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """Codes 1..15 of a frame from the talker's hidden state and code 0 -> (B, 16)."""
    cp = talker.code_predictor
    cache = talker.new_predictor_cache(hidden.shape[0])
    project = cp.small_to_mtp_projection
    inputs = project(torch.stack([hidden, talker.codec(code0)], dim=1))
    codes = [code0]
    position = 0
    for j in range(talker.cfg.num_code_groups - 1):
        out = cp.model(inputs, cache, position)[:, -1]
        position += inputs.shape[1]
        logits = cp.lm_head[j](out).float()
        code = pick(
            logits,
            params.subtalker_do_sample,
            params.subtalker_temperature,
            params.subtalker_top_k,
            params.subtalker_top_p,
            generator,
        )
        codes.append(code)
        if j < talker.cfg.num_code_groups - 2:
            inputs = project(cp.model.codec_embedding[j](code))[:, None]
    return torch.stack(codes, dim=1)
