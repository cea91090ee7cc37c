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


# ------------------------------------------------------------------ batched, inside CUDA graphs

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors (values < 2**32; products stay below 2**60)."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def hashed_gumbel(seeds: torch.Tensor, counters: torch.Tensor, width: int) -> torch.Tensor:
    """Gumbel noise -log(-log(u)) from `hashed_uniform`."""
    return -torch.log(-torch.log(hashed_uniform(seeds, counters, width)))


def hashed_uniform(seeds: torch.Tensor, counters: torch.Tensor, width: int) -> torch.Tensor:
    """Uniform noise in (0, 1), (B, G, width), from counters alone: row b, group g, column i
    gets hash(seed_b, counter_bg, i). No generator state, so a stream's draws depend on its
    seed and frame number only, never on which other streams share the batch.

    seeds: (B,) int64 in [0, 2**31); counters: (B, G) int64 in [0, 2**31)."""
    key = _mix32(seeds[:, None] ^ _mix32(counters))  # (B, G)
    columns = torch.arange(width, device=seeds.device)
    bits = _mix32(key[..., None] ^ columns) >> 9  # 23 bits: (bits + 0.5) / 2**23 is exact in float32, < 1
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


def sample_rows(
    logits: torch.Tensor,
    gumbel: torch.Tensor,
    do_sample: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    width: int = 0,
    nucleus: bool = True,
) -> torch.Tensor:
    """One id per row of (B, V) float32 logits, each row with its own settings, no host sync.

    Greedy rows take the argmax. Sampling rows: scale by temperature (B, 1), keep the top_k
    (B,) best (0 = all) and, when `nucleus`, the smallest set whose probability reaches top_p
    (B,); then a Gumbel-max draw with `gumbel` (B, >= W) noise by rank. With `width` W > 0
    only the W best ids are candidates (every row's top_k must be 1..W); else all are sorted."""
    greedy = logits.argmax(dim=-1)
    scaled = logits / temperature
    if 0 < width < logits.shape[-1]:
        ordered, order = torch.topk(scaled, width, dim=-1)
    else:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
    rank = torch.arange(ordered.shape[-1], device=logits.device)
    keep = (rank[None, :] < top_k[:, None]) | (top_k[:, None] <= 0)
    ordered = ordered.masked_fill(~keep, float("-inf"))
    if nucleus:
        probs = ordered.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability of the better-ranked ids
        outside = (before >= top_p[:, None]) & (top_p[:, None] < 1.0)  # the best id always stays
        ordered = ordered.masked_fill(outside, float("-inf"))
    chosen = order.gather(-1, (ordered + gumbel[:, : ordered.shape[-1]]).argmax(dim=-1, keepdim=True))[:, 0]
    return torch.where(do_sample, chosen, greedy)


def batched_talker_scores(
    logits: torch.Tensor,
    seen: torch.Tensor,
    penalty: torch.Tensor,
    eos_blocked: torch.Tensor,
    eos: torch.Tensor,
    control: torch.Tensor,
) -> torch.Tensor:
    """`talker_scores` for a batch at fixed shapes: `seen` (B, V) marks the codes each row drew
    so far, `penalty` (B, 1), `eos_blocked` (B,) rows still under min_new_tokens, `eos` (V,)
    true at the EOS id."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    scores = torch.where(seen, penalised, logits)
    scores = scores.masked_fill(eos[None, :] & eos_blocked[:, None], float("-inf"))
    return scores.masked_fill(control, float("-inf"))
