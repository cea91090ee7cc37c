"""One Triton kernel per drawn code: the batched sampler of `sampling.py` fused with what
follows the draw (GPU fast path, behind the `fused_kernels` switch).

The PyTorch path spends about twenty small kernels per code (float cast, argmax, temperature,
top-k, rank masks, Gumbel add, argmax, gather, select, embedding lookup, and once per frame
the talker's processors, the repetition history and the sum of sixteen embeddings), and a
frame draws sixteen codes one after the other. `sample_codes` does all of it for every row in
one launch, one program per row:

1. scores: the logits in float32; for the talker also `batched_talker_scores` (repetition
   penalty over the codes seen, EOS blocked under min_new_tokens, control ids suppressed);
2. the `width` best ids by one bitonic top-k over keys (value, then lower id first), which
   gives both the greedy id and the ranked candidates;
3. `sample_rows` on them: temperature, top-k, top-p (when `nucleus`), Gumbel-max with the
   noise by rank, greedy rows taking the best id;
4. the code written into the frame's codes, marked seen (talker), and its embedding row
   gathered: as the code predictor's next input, into the running frame embedding (rounded
   after every add, in the PyTorch order), and once per frame plus the row's text embedding.

Same draws as `sample_rows` (tested in Triton's interpreter against it); ties between equal
scores go to the lower id (torch.topk leaves their order unspecified).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:  # as in kernels.py: Triton comes with CUDA builds of PyTorch
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None


@dataclass(frozen=True, slots=True)
class RowSettings:
    """Per-row sampling settings: do_sample (B,) bool, temperature (B, 1), top_k (B,), top_p (B,)."""

    do_sample: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor


@dataclass(frozen=True, slots=True)
class TalkerScores:
    """What `batched_talker_scores` reads: seen (B, V) bool (updated with the drawn code
    where `moving` (B,) is nonzero: a held row keeps its history), penalty (B, 1), draws and
    min_new (B,) (EOS blocked while draws < min_new), control (V,)."""

    seen: torch.Tensor
    penalty: torch.Tensor
    draws: torch.Tensor
    min_new: torch.Tensor
    control: torch.Tensor
    eos_id: int
    moving: torch.Tensor


@dataclass(frozen=True, slots=True)
class TextRows:
    """Each row's next text embedding: trailing[b, min(draws, rows - 1)] while draws <
    length[b], else `pad`; added to the finished frame embedding into `out` (B, H)."""

    trailing: torch.Tensor
    length: torch.Tensor
    draws: torch.Tensor
    pad: torch.Tensor
    out: torch.Tensor


FRAME_NONE, FRAME_SET, FRAME_ADD = 0, 1, 2

if triton is not None:

    @triton.jit
    def _sample_kernel(
        logits_ptr, s_logits, noise_ptr, s_noise, do_sample_ptr, temp_ptr, top_k_ptr, top_p_ptr,
        codes_ptr, s_codes, table_ptr, embed_ptr, s_embed, frame_ptr,
        seen_ptr, penalty_ptr, draws_ptr, min_new_ptr, control_ptr, eos_id, moving_ptr,
        trailing_ptr, s_tr_b, s_tr_r, text_rows, text_len_ptr, pad_ptr, text_out_ptr,
        V, H, W: tl.constexpr,
        TALKER: tl.constexpr, NUCLEUS: tl.constexpr, EMBED: tl.constexpr, FRAME: tl.constexpr,
        TEXT: tl.constexpr, BLOCK_V: tl.constexpr, K: tl.constexpr, BLOCK_H: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_V)
        inside = cols < V
        x = tl.load(logits_ptr + b * s_logits + cols, mask=inside, other=float("-inf")).to(tl.float32)
        if TALKER:
            penalty = tl.load(penalty_ptr + b)
            seen = tl.load(seen_ptr + b * V + cols, mask=inside, other=0)
            penalised = tl.where(x < 0, x * penalty, tl.math.div_rn(x, penalty))
            x = tl.where(seen != 0, penalised, x)
            blocked = tl.load(draws_ptr + b) < tl.load(min_new_ptr + b)
            x = tl.where(blocked & (cols == eos_id), float("-inf"), x)
            control = tl.load(control_ptr + cols, mask=inside, other=0)
            x = tl.where(control != 0, float("-inf"), x)
            x = tl.where(inside, x, float("-inf"))
        # Keys that order by score, then by lower id: float bits made monotonic as int32, id below.
        bits = x.to(tl.int32, bitcast=True)
        monotonic = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        keys = (monotonic.to(tl.int64) << 32) | (BLOCK_V - 1 - cols).to(tl.int64)
        # The `W` best keys in order, one maximum at a time (a bitonic tl.topk is no faster
        # here for W ~ 50, and crawls in Triton's interpreter, which the CPU tests run).
        rank = tl.arange(0, K)
        best = tl.full((K,), -(2**63), tl.int64)
        for i in range(0, W):
            top = tl.max(keys, axis=0)
            best = tl.where(rank == i, top, best)
            keys = tl.where(keys == top, -(2**63), keys)
        ids = (BLOCK_V - 1) - (best & 0xFFFFFFFF).to(tl.int32)
        high = (best >> 32).to(tl.int32)
        values = (high ^ ((high >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        greedy = tl.sum(tl.where(rank == 0, ids, 0), axis=0)
        scaled = tl.math.div_rn(values, tl.load(temp_ptr + b))
        keep = (rank < tl.load(top_k_ptr + b)) & (rank < W)
        ordered = tl.where(keep, scaled, float("-inf"))
        if NUCLEUS:
            top_p = tl.load(top_p_ptr + b)
            e = tl.exp(ordered - tl.max(ordered, axis=0))
            probs = e / tl.sum(e, axis=0)
            before = tl.cumsum(probs, axis=0) - probs
            limit = tl.where(top_p < 1.0, top_p, float("inf"))  # top_p 1 keeps everything
            ordered = tl.where(before >= limit, float("-inf"), ordered)
        gumbel = tl.load(noise_ptr + b * s_noise + rank, mask=rank < W, other=0.0)
        pick = tl.argmax(ordered + gumbel, axis=0, tie_break_left=True)
        chosen = tl.sum(tl.where(rank == pick, ids, 0), axis=0)
        code = tl.where(tl.load(do_sample_ptr + b) != 0, chosen, greedy)
        tl.store(codes_ptr + b * s_codes, code.to(tl.int64))
        if TALKER:
            tl.store(seen_ptr + b * V + code, 1, mask=tl.load(moving_ptr + b) != 0)
        hcols = tl.arange(0, BLOCK_H)
        hmask = hcols < H
        row = tl.load(table_ptr + code.to(tl.int64) * H + hcols, mask=hmask, other=0.0)
        if EMBED:
            tl.store(embed_ptr + b * s_embed + hcols, row, mask=hmask)
        # The frame's sum stays float32 (the buffer is float32) and is rounded to the model's
        # dtype once, before the text row is added: as `Talker.frame_embedding` and the official sum.
        if FRAME == 1:
            total = row.to(tl.float32)
            tl.store(frame_ptr + b * H + hcols, total, mask=hmask)
        if FRAME == 2:
            total = tl.load(frame_ptr + b * H + hcols, mask=hmask, other=0.0) + row.to(tl.float32)
            tl.store(frame_ptr + b * H + hcols, total, mask=hmask)
        if TEXT:
            draws = tl.load(draws_ptr + b)
            line = tl.minimum(draws, text_rows - 1)
            text = tl.load(trailing_ptr + b * s_tr_b + line * s_tr_r + hcols, mask=hmask, other=0.0)
            pad = tl.load(pad_ptr + hcols, mask=hmask, other=0.0)
            text = tl.where(draws < tl.load(text_len_ptr + b), text, pad)
            total = (total.to(row.dtype).to(tl.float32) + text.to(tl.float32)).to(row.dtype)
            tl.store(text_out_ptr + b * H + hcols, total, mask=hmask)


def sample_codes(
    logits: torch.Tensor,
    noise: torch.Tensor,
    settings: RowSettings,
    width: int,
    nucleus: bool,
    codes: torch.Tensor,
    table: torch.Tensor,
    embed: torch.Tensor | None = None,
    frame: torch.Tensor | None = None,
    frame_mode: int = FRAME_NONE,
    talker: TalkerScores | None = None,
    text: TextRows | None = None,
) -> None:
    """Draw one code per row of `logits` (B, V) into `codes` (B,) (any stride) as `sample_rows`
    would with `width` > 0 ranked candidates, and gather `table[code]`: into `embed` (B, H) when
    given, into the running frame embedding `frame` (B, H, float32) (`FRAME_SET` starts it,
    `FRAME_ADD` adds to it), and with `text` the frame, rounded to the table's dtype, plus the text
    row into `text.out`. `noise` (B, >=
    width) is the Gumbel noise by rank; `talker` applies the talker's processors first."""
    b, v = logits.shape
    h = table.shape[1]
    if not 0 < width <= v or logits.stride(1) != 1 or noise.stride(1) != 1 or table.stride(1) != 1:
        raise ValueError("sample_codes needs 0 < width <= vocab and unit-stride rows")
    if (frame_mode != FRAME_NONE or text is not None) and frame is None:
        raise ValueError("the frame embedding buffer is needed to add to it")
    if text is not None and frame_mode == FRAME_NONE:
        raise ValueError("the text row is added to the frame embedding made in the same call")
    if frame is not None and frame.dtype != torch.float32:
        raise ValueError("the frame embedding buffer accumulates in float32")
    for tensor in (frame, text.out if text else None, talker.seen if talker else None):
        if tensor is not None and not tensor.is_contiguous():
            raise ValueError("the frame, text and seen buffers must be contiguous")
    if embed is not None and embed.stride(-1) != 1:
        raise ValueError("the embedding output needs unit-stride rows")
    unused = logits  # stands in for the pointers a variant does not read
    t, x = talker, text
    _sample_kernel[(b,)](
        logits, logits.stride(0), noise, noise.stride(0),
        settings.do_sample, settings.temperature, settings.top_k, settings.top_p,
        codes, codes.stride(0), table,
        embed if embed is not None else unused, embed.stride(0) if embed is not None else 0,
        frame if frame is not None else unused,
        t.seen.view(torch.uint8) if t else unused, t.penalty if t else unused,
        t.draws if t else x.draws if x else unused, t.min_new if t else unused,
        t.control.view(torch.uint8) if t else unused, t.eos_id if t else 0, t.moving if t else unused,
        x.trailing if x else unused, x.trailing.stride(0) if x else 0, x.trailing.stride(1) if x else 0,
        x.trailing.shape[1] if x else 1, x.length if x else unused, x.pad if x else unused,
        x.out if x else unused,
        v, h, width,
        TALKER=t is not None, NUCLEUS=nucleus, EMBED=embed is not None, FRAME=frame_mode, TEXT=x is not None,
        BLOCK_V=triton.next_power_of_2(v), K=triton.next_power_of_2(width), BLOCK_H=triton.next_power_of_2(h),
        num_warps=4,
    )  # fmt: skip
