"""`voxgate bench segmenter`'s cost part: the metric is the wall time of one pass; the CPU-clock
pass only explains the pushes over the target (voxgate/bench/segmenter.py)."""

from __future__ import annotations

import random

from voxgate.bench.segmenter import TARGET_US, Push, cost_summary, pieces_of, push_costs


def test_the_summary_keeps_the_wall_clock_as_the_metric_and_explains_the_tail():
    fast = [Push(10.0, 0.0, None)] * 97
    costs = [*fast, Push(60.0, 0.0, None, 1), Push(900.0, 800.0, None, 3), Push(55.0, 0.0, None, 1)]
    clocked = [
        *[Push(10.0, 0.0, 9.0)] * 96,
        Push(400.0, 0.0, 20.0),  # descheduled for most of it
        Push(70.0, 0.0, 65.0),  # on the CPU over the target
        Push(120.0, 100.0, 115.0),  # in the collector: not its own work
        Push(40.0, 0.0, 39.0),
    ]
    out = cost_summary(costs, clocked)
    assert out["n"] == 100 and out["p50"] == 10.0 and out["max"] == 900.0
    assert out["p99"] > TARGET_US  # three pushes of 100 over the target: not hidden by the explanation
    assert (out["over_target"], out["over_target_in_gc"]) == (3, 1)
    assert {k: v["n"] for k, v in out["by_segments_emitted"].items()} == {"0": 97, "1": 2, "2+": 1}
    assert out["by_segments_emitted"]["1"]["p50"] == 57.5
    d = out["cpu_clock_pass"]
    assert (d["over_target"], d["off_cpu"], d["cpu_over_target"]) == (3, 1, 1)


def test_push_costs_time_every_piece_and_read_the_cpu_clock_only_when_asked():
    pieces = pieces_of("好的，我来帮你看一下这个问题。Then we can talk about it. " * 3, random.Random(1))
    assert "".join(pieces) == "好的，我来帮你看一下这个问题。Then we can talk about it. " * 3
    assert all(1 <= len(p) <= 4 for p in pieces)
    plain, clocked = push_costs(pieces), push_costs(pieces, repeat=2, cpu_clock=True)
    assert len(plain) == len(clocked) == len(pieces)
    assert all(c.wall > 0 and c.cpu is None for c in plain)
    assert sum(c.emitted for c in plain) == sum(c.emitted for c in clocked) >= 3  # a starter and main segments
    assert all(c.wall > 0 and c.cpu is not None and c.cpu >= 0 for c in clocked)
