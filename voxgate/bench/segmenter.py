"""`voxgate bench segmenter`: the segmenter on replies nobody tuned it for, and its cost.

Two parts, both CPU only and seeded:
- quality: the written corpus (`voxgate/bridge/replies.jsonl`) and the generated one, streamed
  in random 1-4 character pieces, with and without the default cached openers; the failure
  counts of `voxgate.bridge.corpus.check_corpus` (protected splits, audible fragments, starters
  over their bounds or late, lost text) per corpus.
- cost: microseconds per `push` (p50, p99, max) on each written reply and on long inputs
  that used to grow the cost: a 10,000-character Chinese paragraph with no punctuation, the
  same with punctuation, and 10,000 characters of English prose, in 1-4 character pieces;
  `--repeat N` keeps each push's fastest of N passes over the same pieces (a shared 2-core
  machine pauses the process now and then: one pass's p99 moves by 15-40 us from run to run).

The metric is the wall time of each push in one pass (issue 18: p99 <= 50 us), with how many
pushes passed 50 us and how many of those ran the collector (`gc.callbacks`, free when it does
not run). To tell the code's cost from the process's pauses without touching the metric, a
second pass over the same pieces also reads this thread's CPU clock around each push (a system
call each: it adds 1-3 us to that pass's p99 on the 2-core VM, so it is not the metric's pass):
of its pushes over 50 us, how many spent most of that time off the CPU (descheduled) and how
many used over 50 us of CPU themselves.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from voxgate.bench.stats import machine, summary, write_report
from voxgate.bridge.corpus import check_corpus, load_replies, make_replies
from voxgate.bridge.segmenter import Segmenter
from voxgate.config import DEFAULT_STARTERS

_ZH = "根据国家统计局发布的数据今年前三个季度全国居民人均可支配收入实际增长了百分之五点二我们见面可以详细聊聊"
_EN = "The quick brown fox, who had read Ph.D. theses on Nov. 26, jumped over 3.14 lazy dogs at 5 p.m. today. "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=1, help="seed for the piece sizes")
    parser.add_argument("--long-chars", type=int, default=10_000, help="length of the long inputs")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="stream each input this many times and keep each push's fastest (on a shared machine, "
        "what the code costs without the pauses of other processes; 1: one pass, as before)",
    )
    parser.add_argument("--output-json", default=None, help="where to write results (default bench/results/...)")


TARGET_US = 50.0  # issue 18: p99 per push, in one pass, at any reply length


class Push(NamedTuple):
    wall: float  # microseconds on the wall clock: the metric
    gc: float  # of the wall time, in the collector
    cpu: float | None  # this thread's CPU time around the push (and its clock reads, ~0.5 us), if read
    emitted: int = 0  # segments the push returned


class _Collector:
    """Wall time the collector runs (a `gc.callbacks` hook), summed."""

    def __init__(self) -> None:
        self.total, self._began = 0, 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter_ns()
        else:
            self.total += time.perf_counter_ns() - self._began


def pieces_of(text: str, rng: random.Random) -> list[str]:
    """`text` in random 1-4 character pieces."""
    pieces, i = [], 0
    while i < len(text):
        k = rng.randint(1, 4)
        pieces.append(text[i : i + k])
        i += k
    return pieces


def push_costs(pieces: list[str], repeat: int = 1, cpu_clock: bool = False) -> list[Push]:
    """Each `push` of the pieces (flush excluded); with `repeat`, the same pieces streamed that
    many times, each push's fastest pass kept: the pushes are the same every time, so only what
    other processes cost differs. `cpu_clock`: read this thread's CPU clock around each push too."""
    costs = [Push(float("inf"), 0.0, None)] * len(pieces)
    wall, collector = time.perf_counter_ns, _Collector()
    cpu = time.thread_time_ns if cpu_clock else _no_clock
    gc.callbacks.append(collector)
    try:
        for _ in range(max(1, repeat)):
            segmenter = Segmenter(openers=DEFAULT_STARTERS)
            for n, piece in enumerate(pieces):
                c0, collected = cpu(), collector.total
                t0 = wall()
                emitted = len(segmenter.push(piece))
                t1 = wall()
                c1 = cpu()
                if (t1 - t0) / 1000 < costs[n].wall:
                    used = (c1 - c0) / 1000 if cpu_clock else None
                    costs[n] = Push((t1 - t0) / 1000, (collector.total - collected) / 1000, used, emitted)
            segmenter.flush()
    finally:
        gc.callbacks.remove(collector)
    return costs


def _no_clock() -> int:
    return 0


def _costs(streams: list[list[str]], repeat: int, cpu_clock: bool = False) -> list[Push]:
    return [c for pieces in streams for c in push_costs(pieces, repeat, cpu_clock)]


def cost_summary(costs: list[Push], clocked: list[Push]) -> dict[str, Any]:
    """The wall clock's p50/p99/max (the metric) and the pushes over the target (how many ran
    the collector); from `clocked` (a pass with the CPU clock read), what its pushes over the
    target were: mostly off the CPU, or over the target in CPU time themselves."""
    out: dict[str, Any] = summary([c.wall for c in costs], 2)
    out["over_target"] = sum(1 for c in costs if c.wall > TARGET_US)
    out["over_target_in_gc"] = sum(1 for c in costs if c.wall > TARGET_US and c.gc > 0)
    by_emitted: dict[str, list[float]] = {"0": [], "1": [], "2+": []}  # pushes that emit segments cost more
    for c in costs:
        by_emitted[str(c.emitted) if c.emitted < 2 else "2+"].append(c.wall)
    out["by_segments_emitted"] = {}
    for k, walls in by_emitted.items():
        part = summary(walls, 2)
        out["by_segments_emitted"][k] = {"n": part["n"], "p50": part["p50"], "p99": part["p99"]}
    over = [c for c in clocked if c.wall > TARGET_US and c.cpu is not None]
    out["cpu_clock_pass"] = {
        "p99": summary([c.wall for c in clocked], 2)["p99"],
        "cpu_p99": summary([c.cpu or 0.0 for c in clocked], 2)["p99"],
        "over_target": len(over),
        "off_cpu": sum(1 for c in over if c.wall - (c.cpu or 0.0) > c.wall / 2),  # descheduled for most of it
        "cpu_over_target": sum(1 for c in over if (c.cpu or 0.0) - c.gc > TARGET_US),  # its own work
    }
    return out


def long_inputs(chars: int) -> dict[str, str]:
    zh = (_ZH * (chars // len(_ZH) + 1))[:chars]
    punctuated = "".join(_ZH[k % len(_ZH)] + ("，" if k % 23 == 22 else "") for k in range(chars))[:chars]
    return {
        f"zh_{chars}_no_punctuation": zh,
        f"zh_{chars}_punctuated": punctuated,
        f"en_{chars}": (_EN * (chars // len(_EN) + 1))[:chars],
    }


def run_segmenter_bench(args: argparse.Namespace) -> int:
    stamp = datetime.now(UTC)
    written = load_replies()
    quality: dict[str, Any] = {}
    for name, replies in (("written", written), ("generated", make_replies(seed=11))):
        for label, openers in (("no_openers", ()), ("openers", DEFAULT_STARTERS)):
            print(f"quality: {name} corpus, {label} ...", flush=True)
            report = check_corpus(replies, seed=args.seed, openers=openers)
            report["failures"] = report["failures"][:5]
            quality[f"{name}/{label}"] = report
    rng = random.Random(args.seed)
    print("cost: every written reply, then the long inputs ...", flush=True)
    load_before = round(os.getloadavg()[0], 2)
    inputs = {"written_corpus": [pieces_of(reply.text, rng) for reply in written]}
    inputs |= {name: [pieces_of(text, rng)] for name, text in long_inputs(args.long_chars).items()}
    passes = {name: _costs(streams, args.repeat) for name, streams in inputs.items()}
    cost = {}
    for name, streams in inputs.items():  # the second pass, after every input's first
        cost[name] = cost_summary(passes[name], _costs(streams, args.repeat, cpu_clock=True))
        if name != "written_corpus":  # the last tenth: does the cost grow with what came before?
            tail = passes[name][len(passes[name]) * 9 // 10 :]
            cost[name]["last_tenth_p99"] = summary([c.wall for c in tail], 2)["p99"]
    process = {"load_avg_1m_before": load_before, "cpus_allowed": len(os.sched_getaffinity(0)), "nice": os.nice(0),
               "gc_threshold": gc.get_threshold()}  # fmt: skip
    report = {"bench": "segmenter", "time": stamp.isoformat(), "machine": machine(), "process": process,
              "seed": args.seed, "target_us": TARGET_US,
              "command": f"voxgate bench segmenter --seed {args.seed} --long-chars {args.long_chars} "
                         f"--repeat {args.repeat}", "repeat": args.repeat,
              "quality": quality, "cost_us_per_push": cost}  # fmt: skip
    keys = ("protected_splits", "unspeakable_segments", "short_segments", "narrow_length_cuts", "cjk_orphans",
            "starter_over_bounds", "starter_late", "lost_or_duplicated", "split_dependent")  # fmt: skip
    lines = ["| corpus | replies | spans | " + " | ".join(keys) + " |", "|---" * (len(keys) + 3) + "|"]
    for name, q in quality.items():
        lines.append(
            f"| {name} | {q['replies']} | {q['protected_spans']} | " + " | ".join(str(q[k]) for k in keys) + " |"
        )
    lines += ["", "| input | pushes | p50 us | p99 us | max us | last tenth p99 us | p50 / p99 us by segments emitted: "
              "0, 1, 2+ | over 50 us (in GC) | CPU-clock pass: p99 / CPU p99 us, over 50 us (mostly off CPU / own "
              "CPU over 50) |", "|---" * 9 + "|"]  # fmt: skip
    for name, c in cost.items():
        d, e = c["cpu_clock_pass"], c["by_segments_emitted"]
        by = ", ".join(f"{e[k]['p50']} / {e[k]['p99']}" for k in ("0", "1", "2+"))
        lines.append(f"| {name} | {c['n']} | {c['p50']} | {c['p99']} | {c['max']} | {c.get('last_tenth_p99', '')} "
                     f"| {by} | {c['over_target']} ({c['over_target_in_gc']}) | {d['p99']} / {d['cpu_p99']}, "
                     f"{d['over_target']} ({d['off_cpu']} / {d['cpu_over_target']}) |")  # fmt: skip
    write_report(report, "segmenter", stamp, args.output_json, "\n".join(lines))
    return 0
