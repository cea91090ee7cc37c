"""The batched decoder's step on a GPU: what each captured bucket's step costs, and where it goes.

1. `step_ms`: each bucket's captured step, replayed `--repeats` times (median), the cost a change
   to the step adds or saves. Run it once per tree (PYTHONPATH) on one warm machine, alternating,
   and compare medians.
2. `parts` (for the buckets in `--parts`, default 1 and 64): the step's GPU operations (kernels,
   copies, fills) counted and timed by the profiler, per part of the step, each part run alone
   through the decoder's own code on its own buffers:
   - talker: the talker's step (28 layers, the codec head);
   - code_predictor: the 15 code-predictor sub-steps and their heads (the draw less its sampler);
   - sampler: the Gumbel noise and the fused sampler's kernels (one per code, `_sample_kernel`);
   - codec: one frame of the incremental codec decoder (on a second stream in the step);
   - other: the whole step run eagerly less those parts (row bookkeeping);
   `gpu_ms` is the sum of the operations' durations (no launch gaps), `top` their five costliest
   names; the whole step's replayed graph is timed (`graph_ms`) and its operations counted.

    PYTHONPATH=<tree> python bench/qwen3_step_profile.py --model-dir CKPT --rows 64 --parts 1,64 \
        --output-json $OUT/step-profile.json

Idle rows compute like moving ones (fixed shapes), so the figures are a full bucket's. Where
the rows stand in the talker's cache (`--positions`) matters to an attention that reads each row
only up to its own position: `end` (default) puts every row at the attention length's last slot
(the bucket's worst case), `spread` spreads them evenly from the first slot to the last (streams
at every point of their lives), `start` leaves them at 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from voxgate.bench.stats import add_codec_lean_argument

SAMPLER_KERNEL = "_sample_kernel"  # the fused sampler's Triton kernel (voxgate/engines/qwen3/fused_sampler.py)
Ops = list[tuple[str, float]]  # (operation name, microseconds) per operation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=64, help="batch rows (buckets 1, 2, 4 ... up to it)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--parts", default="1,64", help="buckets to break down by part (default 1,64)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only checks the script (CPU ops, no graphs)")
    add_codec_lean_argument(parser)
    parser.add_argument("--positions", choices=("end", "spread", "start"), default="end",
                        help="where the rows stand in the talker's cache (see above)")  # fmt: skip
    parser.add_argument("--label", default="")
    parser.add_argument("--output-json", type=Path, default=None)
    args = parser.parse_args()
    report = profile_step(args)
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(json.dumps(report))


def profile_step(args: argparse.Namespace) -> dict[str, Any]:
    from voxgate.engines.qwen3.batch import BatchDecoder
    from voxgate.engines.qwen3.config import SamplingParams
    from voxgate.engines.qwen3.loader import load_checkpoint

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here (--device cpu only checks the script)")
    ck = load_checkpoint(
        args.model_dir, args.device, torch.bfloat16 if cuda else torch.float32, codec_lean=args.codec_lean
    )
    sampling = SamplingParams.from_generation_config(ck.generation)  # as the engine captures it
    t0 = time.perf_counter()
    with torch.inference_mode():  # as at start-up, where the buffers are made
        decoder = BatchDecoder(ck.talker, ck.codec, slots=args.rows, capacity=2048, sampling=sampling)
        start_s = time.perf_counter() - t0
        length = decoder.lengths[min(1, len(decoder.lengths) - 1)]  # as `profile`: 512 positions
        place_rows(decoder.position, length, args.positions)
        costs = decoder.profile(args.repeats) if cuda else {}
        buckets = [b for b in (int(x) for x in args.parts.split(",") if x) if b in decoder.buckets]
        parts = {str(b): breakdown(decoder, b, length, cuda, args.repeats) for b in buckets}
    return {
        "label": args.label, "rows": args.rows, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "model": ck.model_dir.name, "attention_length": length,
        "positions": args.positions,
        "fused_kernels": ck.talker.model.kernels, "fused_sampler": decoder.fused_sampler, "codec_lean": args.codec_lean,
        "start_s": round(start_s, 1), "step_ms": {b: round(c * 1e3, 3) for b, c in costs.items()}, "parts": parts,
    }  # fmt: skip


def place_rows(position: torch.Tensor, length: int, how: str) -> None:
    """The rows' talker positions for the measurement (idle rows do not move: they stay there)."""
    if how == "end":
        position.fill_(length - 1)
    elif how == "spread":
        position.copy_(torch.linspace(0, length - 1, len(position)).round().to(position.dtype))


def part_calls(decoder: Any, b: int, length: int) -> dict[str, Callable[[], Any]]:
    """Each part of `BatchDecoder._step_body` for bucket b, as the step calls it, on its buffers."""
    from voxgate.engines.qwen3.sampling import hashed_gumbel

    d = decoder
    width = d.sample_width or d.talker.cfg.vocab_size

    def noise() -> torch.Tensor:
        counters = d.draws[:b, None] * d.groups + torch.arange(d.groups, device=d.device)
        return hashed_gumbel(d.seeds[:b], counters, width)

    fixed = noise()
    embeds = d._talker_in[:b] if d.fused_sampler else torch.zeros_like(d.hidden[:b])
    return {
        "noise": noise,
        "draw": (lambda: d._draw_fused(b, fixed)) if d.fused_sampler else (lambda: d._draw(b, fixed)),
        "talker": lambda: d.talker.step(embeds[:, None], d.cache.view(slice(0, b), length), d.position[:b]),
        "codec": lambda: d._decode(b, d.out_codes[:b]),
        "step": lambda: d._step_body(b, length),
    }


def breakdown(decoder: Any, b: int, length: int, cuda: bool, repeats: int) -> dict[str, Any]:
    """Bucket b's step by part (see the module docstring), per step."""
    ops = {name: operations(call, cuda) for name, call in part_calls(decoder, b, length).items()}
    sampler = [op for op in ops["draw"] if SAMPLER_KERNEL in op[0]]
    rows = {
        "talker": ops["talker"],
        "code_predictor": [op for op in ops["draw"] if SAMPLER_KERNEL not in op[0]],
        "sampler": ops["noise"] + sampler,
        "codec": ops["codec"],
    }
    table = {name: summary(found) for name, found in rows.items()}
    step = summary(ops["step"])
    rest = step["gpu_ms"] - sum(r["gpu_ms"] for r in table.values())
    table["other"] = {"ops": step["ops"] - sum(r["ops"] for r in table.values()), "gpu_ms": round(rest, 3), "top": []}
    result: dict[str, Any] = {"parts": table, "eager_step": step}
    if cuda:
        graph = decoder._graphs[b, length]
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        replayed = summary(operations(graph.replay, cuda))  # 0 ops: this profiler does not see into graphs
        result["graph"] = {"graph_ms": round(1e3 * statistics.median(walls), 3), **replayed}
    return result


def operations(call: Callable[[], Any], cuda: bool) -> Ops:
    """The operations one call runs (after one untimed call): on a GPU its kernels, copies and
    fills with their durations; on the CPU (a check of the script) its top-level CPU ops."""
    call()
    _sync(cuda)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        call()
        _sync(cuda)
    events = prof.events()
    if cuda:
        return [(e.name, e.time_range.elapsed_us()) for e in events if e.device_type == DeviceType.CUDA]
    return [(e.name, e.time_range.elapsed_us()) for e in events if e.cpu_parent is None]


def summary(ops: Ops) -> dict[str, Any]:
    by_name: dict[str, float] = {}
    for name, us in ops:
        by_name[name] = by_name.get(name, 0.0) + us
    top = sorted(by_name.items(), key=lambda item: -item[1])[:5]
    return {"ops": len(ops), "gpu_ms": round(sum(us for _, us in ops) / 1e3, 3),
            "top": [{"name": name[:80], "ms": round(us / 1e3, 3)} for name, us in top]}  # fmt: skip


def table(report: dict[str, Any]) -> str:
    """Markdown: per bucket, ops and summed GPU ms per part, and the replayed step."""
    lines = ["| bucket | part | GPU ops | GPU ms |", "|---|---|---|---|"]
    for bucket, found in report["parts"].items():
        for name, row in found["parts"].items():
            lines.append(f"| {bucket} | {name} | {row['ops']} | {row['gpu_ms']} |")
        step = found["eager_step"]
        lines.append(f"| {bucket} | whole step, eager | {step['ops']} | {step['gpu_ms']} |")
        if "graph" in found:
            graph = found["graph"]
            lines.append(f"| {bucket} | whole step, graph (wall {graph['graph_ms']} ms) | {graph['ops']} | "
                         f"{graph['gpu_ms']} |")  # fmt: skip
    return "\n".join(lines)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
