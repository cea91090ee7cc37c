"""Choosing codes from logits, as the reference generation does it, on the device.

Talker: repetition penalty over the codes generated so far (greedy too), EOS blocked for
the first `min_new_tokens` draws, control ids suppressed except EOS, then temperature,
top-k, top-p and a multinomial draw (or argmax). Code predictor: temperature, top-k,
top-p only.
"""

from __future__ import annotations

import torch


def repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (B, V); history (B, N) of earlier ids: divide positive, multiply negative scores."""
    if penalty == 1.0 or history.shape[-1] == 0:
        return logits
    picked = logits.gather(-1, history)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return logits.scatter(-1, history, picked)


def pick(
    logits: torch.Tensor,
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """One id per row of (B, V) float32 logits."""
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p
        drop[..., -1:] = False  # keep at least one
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def control_mask(vocab_size: int, audio_codes: int, eos_id: int, device: torch.device) -> torch.Tensor:
    """True for the talker's control ids (everything past the audio codes) except EOS."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[audio_codes:] = True
    mask[eos_id] = False
    return mask


def talker_scores(
    logits: torch.Tensor,
    history: torch.Tensor,
    draw: int,
    penalty: float,
    min_new_tokens: int,
    eos_id: int,
    control: torch.Tensor,
) -> torch.Tensor:
    """The reference's processors for code 0, in its order: repetition penalty over the codes
    drawn so far, EOS blocked for the first `min_new_tokens` draws, control ids suppressed."""
    scores = repetition_penalty(logits, history, penalty)
    if draw < min_new_tokens:
        scores[:, eos_id] = float("-inf")
    return scores.masked_fill(control, float("-inf"))
