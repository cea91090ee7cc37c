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
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime
from typing import Any

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


def push_costs(text: str, rng: random.Random, repeat: int = 1) -> list[float]:
    """Microseconds of each `push` of `text` in random 1-4 character pieces (flush excluded);
    with `repeat`, the same pieces streamed that many times, each push's fastest kept: the
    pushes are the same every time, so only what other processes cost differs."""
    pieces, i = [], 0
    while i < len(text):
        k = rng.randint(1, 4)
        pieces.append(text[i : i + k])
        i += k
    costs = [float("inf")] * len(pieces)
    clock = time.perf_counter_ns
    for _ in range(max(1, repeat)):
        segmenter = Segmenter(openers=DEFAULT_STARTERS)
        for n, piece in enumerate(pieces):
            t0 = clock()
            segmenter.push(piece)
            costs[n] = min(costs[n], (clock() - t0) / 1000)
        segmenter.flush()
    return costs


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
    corpus_costs = [c for reply in written for c in push_costs(reply.text, rng, args.repeat)]
    cost = {"written_corpus": summary(corpus_costs, 2)}
    for name, text in long_inputs(args.long_chars).items():
        costs = push_costs(text, rng, args.repeat)
        cost[name] = summary(costs, 2)
        tail = costs[len(costs) * 9 // 10 :]  # the last tenth: does the cost grow with what came before?
        cost[name]["last_tenth_p99"] = summary(tail, 2)["p99"]
    report = {"bench": "segmenter", "time": stamp.isoformat(), "machine": machine(), "seed": args.seed,
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
    lines += ["", "| input | pushes | p50 us | p99 us | max us | last tenth p99 us |", "|---|---|---|---|---|---|"]
    for name, c in cost.items():
        lines.append(f"| {name} | {c['n']} | {c['p50']} | {c['p99']} | {c['max']} | {c.get('last_tenth_p99', '')} |")
    write_report(report, "segmenter", stamp, args.output_json, "\n".join(lines))
    return 0
