"""`voxgate regress stability`: how much each gate's number moves between identical runs,
and the thresholds that spread suggests (the seeds calibrated theirs the same way).

Pure: run summaries in, per-metric statistics and suggestions out. Hard limits (no invalid
audio, one hash, no repeat, no clipping, SNR and duration against the baseline) are kept as
they are; latency, stream-vs-offline, clicks and silence gaps get
max(p95 x 1.2, median + 2 sigma), rounded up to two significant digits (kept when every
sample is the same: no spread, nothing to calibrate on).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from voxgate.regress.gates import Gate
from voxgate.stats import percentile

# gate -> (per-case field in summary.json, or None for the run-level gate value)
SAMPLES: dict[str, str | None] = {
    "ttfa_p95": None,
    "stream_vs_offline": "stream_vs_offline_ms",
    "pop_click": "pop_click",
    "max_silence_gap": "max_silence_gap_s",
    "repeat": "repeat_s",
    "clipping": "clipping",
    "snr_vs_golden": "snr_vs_golden_db",
    "determinism": "unique_hashes",
}
CALIBRATED = ("ttfa_p95", "stream_vs_offline", "pop_click", "max_silence_gap")


def samples(summaries: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Each gate's numbers over the runs: the run's value for run-level gates, every text's
    value for per-text ones."""
    out: dict[str, list[float]] = {name: [] for name in SAMPLES}
    for summary in summaries:
        gates = {g["name"]: g["value"] for g in summary["gates"]}
        for name, field in SAMPLES.items():
            if field is None:
                values = [gates.get(name)]
            else:
                values = [c.get(field) for c in summary["cases"] if not c["problems"]]
            out[name] += [float(v) for v in values if v is not None]
    return out


def _round_up(x: float) -> float:
    if x <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step) * step


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "median": None, "p95": None, "sigma": None, "min": None, "max": None}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p95": percentile(values, 95),
        "sigma": statistics.pstdev(values),
        "min": min(values),
        "max": max(values),
    }


def suggest(gate: Gate, stats: dict[str, Any]) -> tuple[float, str]:
    """(suggested threshold, how it was found)."""
    if gate.name not in CALIBRATED or not stats["n"]:
        return gate.threshold, "kept (hard limit)" if stats["n"] else "kept (no data)"
    if stats["max"] == stats["min"]:  # e.g. always 0 ms: any threshold would be a guess
        return gate.threshold, "kept (no spread)"
    value = _round_up(max(stats["p95"] * 1.2, stats["median"] + 2 * stats["sigma"]))
    return value, "max(p95 x 1.2, median + 2 sigma)"


def table(gates: Sequence[Gate], summaries: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """Rows per gate (statistics, current and suggested thresholds) and the same as Markdown."""
    data = samples(summaries)
    rows = []
    for gate in gates:
        if gate.name not in SAMPLES:
            continue
        stats = spread(data[gate.name])
        suggested, method = suggest(gate, stats)
        rows.append({"gate": gate.name, "unit": gate.unit, **stats, "threshold": gate.threshold, "op": gate.op,
                     "suggested": suggested, "method": method})  # fmt: skip
    lines = ["| gate | n | median | p95 | sigma | now | suggested | method |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["gate"], r["n"]] + [_num(r[k]) for k in ("median", "p95", "sigma")]
        cells += [f"{r['op']} {r['threshold']:g} {r['unit']}", f"{r['suggested']:g}", r["method"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows, "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
