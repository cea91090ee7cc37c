"""What `voxgate bench parity` measures (see `voxgate.bench.parity`): the prompts, the
figures (KL, top-k agreement, SNR), the tolerance against the official bf16 yardstick, and
the three runs on one checkpoint put together."""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxgate.bench.parity_runs import Case, ForcedDecoder, Trace, load_official, run_official, run_voxgate

CASES = {
    "custom_voice": [
        Case("speaker-en", "The quick brown fox jumps over the lazy dog, then runs off into the woods.", "English",
             speaker="Vivian"),
        Case("dialect-zh", "你好，世界！今天天气不错，我们一起去公园散步吧。", "Chinese", speaker="Eric"),
        Case("streamed-text", "Streaming text goes in one token per frame, as a live reply would.", speaker="Ryan",
             stream_text=True),
        Case("speaker-instruct", "A larger talker follows an instruction.", "English", speaker="Serena",
             instruct="Speak happily."),  # 1.7B only: the 0.6B model was not trained on instructions
    ],
    "base": [
        Case("clone-xvector", "A cloned voice from an x-vector only, speaking a full sentence.", clone="xvector",
             stream_text=True),
        Case("clone-icl", "In-context cloning continues the reference speaker.", clone="icl",
             ref_text="This is me speaking, as a reference.", stream_text=True),
    ],
    "voice_design": [
        Case("design-warm", "A designed voice reads this sentence slowly.", "English",
             instruct="A warm, low female voice."),
        Case("design-bright", "Another designed voice, brighter and faster.", "English",
             instruct="A bright young male voice, speaking quickly."),
    ],
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Agreement:
    """How one run's logits agree with the reference's over `rows` rows (frames x codes)."""

    rows: int
    kl_mean: float  # KL(P_ref || P_run) in nats, softmax over the whole vocabulary
    kl_p99: float
    kl_max: float
    top1: float  # share of rows whose argmax is the reference's
    topk: float  # mean share of the reference's top-k ids among the run's top-k
    clear_rows: int = 0  # rows whose reference leads its runner-up by more than the margin (see `clear_margin`)
    top1_clear: float = 1.0  # share of those whose argmax is the reference's


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How much worse than the official bf16 yardstick voxgate may be: bf16 rounding of two
    different (equally valid) summation orders spreads both ways, so 'no larger' gets a margin."""

    kl_ratio: float = 1.5  # voxgate's mean KL <= kl_ratio x the yardstick's
    kl_floor: float = 1e-6  # ... or below this (both exact, e.g. fp32 on the CPU)
    top1_drop: float = 0.03  # voxgate's top-1 agreement on clear rows >= the yardstick's - top1_drop
    snr_drop_db: float = 3.0  # voxgate's PCM SNR >= the yardstick's - snr_drop_db


CLEAR_SIGMAS = 4.0  # a row is clear when the reference's lead exceeds this many RMS bf16 logit errors


def clear_margin(reference: torch.Tensor, yardstick: torch.Tensor) -> float:
    """The logit lead below which bf16 may honestly flip a row's argmax: `CLEAR_SIGMAS` times the
    yardstick's (the official bf16's) RMS logit error against the reference. Top-1 agreement over
    all rows counts such near-ties, which either bf16 run flips by chance (on 100-400 frames one
    frame is 0.25-1 %: voxgate alone and in a bucket differed by 0.033 on the same codes); over
    the clear rows a flip is a real disagreement."""
    diff = (yardstick.double() - reference.double()).reshape(-1)
    return CLEAR_SIGMAS * diff.pow(2).mean().sqrt().item()


def agreement(reference: torch.Tensor, other: torch.Tensor, k: int = 10, margin: float = 0.0) -> Agreement:
    """Compare logits (..., V) row by row; `margin`: the lead that makes a row clear."""
    ref, oth = reference.reshape(-1, reference.shape[-1]).double(), other.reshape(-1, other.shape[-1]).double()
    lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(oth, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0)
    same = ref.argmax(-1) == oth.argmax(-1)
    a, b = ref.topk(k, -1).indices, oth.topk(k, -1).indices
    topk = (a[:, :, None] == b[:, None, :]).any(-1).double().mean()
    best = ref.topk(2, -1).values
    clear = best[:, 0] - best[:, 1] > margin
    top1_clear = same[clear].double().mean().item() if clear.any() else 1.0
    return Agreement(len(kl), kl.mean().item(), kl.quantile(0.99).item(), kl.max().item(), same.double().mean().item(),
                     topk.item(), int(clear.sum()), top1_clear)  # fmt: skip


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """10 log10(|ref|^2 / |other - ref|^2) over the common length."""
    n = min(len(reference), len(other))
    ref, oth = reference[:n].astype(np.float64), other[:n].astype(np.float64)
    noise = float(((oth - ref) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float((ref**2).sum()) / noise)


def margins(reference: list[Trace], yardstick: list[Trace]) -> dict[str, float]:
    """Each part's clear-row margin (`clear_margin`), from the yardstick's error on the same prompts."""
    parts = {"code0": lambda t: t.code0, "predictor": lambda t: t.rest}
    return {
        name: clear_margin(torch.cat([part(t) for t in reference]), torch.cat([part(t) for t in yardstick]))
        for name, part in parts.items()
    }


def compare(
    reference: list[Trace], runs: list[Trace], k: int, margin: dict[str, float] | None = None
) -> dict[str, Any]:
    """Agreement of code 0 and of codes 1..15 over all prompts, and the PCM's SNR."""
    m = margin or {}
    code0 = agreement(torch.cat([t.code0 for t in reference]), torch.cat([t.code0 for t in runs]), k, m.get("code0", 0))
    rest = agreement(
        torch.cat([t.rest for t in reference]), torch.cat([t.rest for t in runs]), k, m.get("predictor", 0)
    )
    ref_pcm, run_pcm = np.concatenate([t.pcm for t in reference]), np.concatenate([t.pcm for t in runs])
    return {"code0": asdict(code0), "predictor": asdict(rest), "pcm_snr_db": round(snr_db(ref_pcm, run_pcm), 2)}


def verdict(ours: dict[str, Any], yardstick: dict[str, Any], tol: Tolerance) -> dict[str, bool]:
    """Whether each of voxgate's figures is within the tolerance of the official bf16 run's."""
    out = {}
    for part in ("code0", "predictor"):
        kl, ref_kl = ours[part]["kl_mean"], yardstick[part]["kl_mean"]
        out[f"{part}_kl"] = kl <= max(tol.kl_ratio * ref_kl, tol.kl_floor)
        out[f"{part}_top1"] = ours[part]["top1_clear"] >= yardstick[part]["top1_clear"] - tol.top1_drop
    out["pcm_snr"] = ours["pcm_snr_db"] >= yardstick["pcm_snr_db"] - tol.snr_drop_db
    return out


def checkpoint(args: argparse.Namespace, scratch: Path) -> Path:
    if args.model_dir:
        return Path(args.model_dir)
    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint

    configs = Path(args.configs) if args.configs else None
    return make_random_checkpoint(args.model, scratch / "ck", tiny=args.tiny, seed=args.seed, config_root=configs)


def _voice(hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """A clone's x-vector and reference codes (random: the weights are random too)."""
    gen = torch.Generator().manual_seed(seed)
    return {"xvector": torch.randn(hidden, generator=gen), "ref_codes": torch.randint(0, 2048, (24, 16), generator=gen)}


def _progress(message: str) -> None:
    print(message, flush=True)


def measure(
    model_dir: Path, device: str, dtype: torch.dtype, frames: int, seed: int, bucket: int = 0, k: int = 10,
    kernels: bool = True, codec_lean: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The whole comparison on one checkpoint (see the module docstring): a JSON-ready dict."""
    from voxgate.engines.qwen3.loader import load_checkpoint

    t0 = time.perf_counter()
    official = load_official(model_dir, device, torch.float32)
    kind = official.model.config.tts_model_type
    cases = [c for c in CASES[kind] if not (c.instruct and official.model.config.tts_model_size == "0b6"
                                             and kind == "custom_voice")]  # fmt: skip
    voice = _voice(official.model.config.talker_config.hidden_size, seed)
    teachers, reference = [], []
    for i, case in enumerate(cases):
        codes, trace = run_official(official, case, voice, frames, None, seed + i)
        teachers.append(codes)
        reference.append(trace)
        _progress(f"official fp32 {case.name}: {frames} frames drawn ({time.perf_counter() - t0:.0f} s)")
    del official
    yard = load_official(model_dir, device, torch.bfloat16, attention="sdpa")
    yardstick = [run_official(yard, c, voice, frames, t, seed)[1] for c, t in zip(cases, teachers, strict=True)]
    del yard
    _progress(f"official bf16 forced ({time.perf_counter() - t0:.0f} s)")
    ck = load_checkpoint(model_dir, device, dtype, fused_kernels=kernels, codec_lean=codec_lean)
    decoder = _decoder(ck, max(1, bucket), frames)
    ours = [run_voxgate(decoder, ck, [(c, t)], voice) for c, t in zip(cases, teachers, strict=True)]
    _progress(f"voxgate {dtype} forced ({time.perf_counter() - t0:.0f} s)")
    margin = margins(reference, yardstick)
    result = {"kind": kind, "cases": [c.name for c in cases], "frames_per_case": frames,
              "frames": frames * len(cases), "topk": k, "fused_kernels": ck.talker.model.kernels,
              "codec_lean": codec_lean,
              "graphs": decoder.stats.captured, "fused_sampler": decoder.fused_sampler, "clear_margin": margin,
              "official_bf16": compare(reference, yardstick, k, margin),
              "voxgate": compare(reference, ours, k, margin)}  # fmt: skip
    if bucket > 1:
        crowd = [(cases[i % len(cases)], teachers[i % len(cases)].roll(i, 0)) for i in range(1, bucket)]
        together = run_voxgate(decoder, ck, [(cases[0], teachers[0]), *crowd], voice)
        result["bucket"] = {"rows": bucket, "case": cases[0].name,
                            "vs_fp32": compare(reference[:1], [together], k, margin),
                            "alone_vs_fp32": compare(reference[:1], ours[:1], k, margin),
                            "vs_alone": compare(ours[:1], [together], k, margin)}  # fmt: skip
        _progress(f"voxgate in a bucket of {bucket} ({time.perf_counter() - t0:.0f} s)")
    tol = Tolerance()
    result["tolerance"] = asdict(tol)
    result["holds"] = verdict(result["voxgate"], result["official_bf16"], tol)
    result["kl_ratio"] = {part: _ratio(result["voxgate"][part]["kl_mean"], result["official_bf16"][part]["kl_mean"])
                          for part in ("code0", "predictor")}  # fmt: skip
    if "bucket" in result:
        result["holds"]["bucket"] = all(verdict(result["bucket"]["vs_fp32"], result["official_bf16"], tol).values())
    return result


def _ratio(ours: float, yardstick: float) -> float | None:
    return round(ours / yardstick, 3) if yardstick > 0 else None


def _decoder(ck: Any, slots: int, frames: int) -> ForcedDecoder:
    from dataclasses import replace

    from voxgate.engines.qwen3.config import SamplingParams

    sampling = replace(SamplingParams.from_generation_config(ck.generation), min_new_tokens=0)
    capacity = 256 * max(1, math.ceil((frames + 160) / 256))  # the longest prompt (ICL) and the frames
    return ForcedDecoder(ck.talker, ck.codec, slots=slots, capacity=capacity, sampling=sampling)
