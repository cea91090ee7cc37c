"""`voxgate regress e2e-stability`: how much each e2e gate's number moves between identical
runs, and the thresholds that spread suggests (pure; the seeds calibrated theirs this way).

Samples: every P0 reply's value for per-reply gates, the run's value for run-level ones.
Suggested: max(p95 x 1.2, median + 2 sigma), two significant digits, rounded up, for the
measured gates; counts, rates and the KPI regression (hard limits) are kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from voxgate.regress.stability import spread

# gate -> per-reply field in summary["replies"] (None: the run-level gate value), and a transform
PER_REPLY = {"max_gap": "max_gap_ms", "added_gap": "added_gap_ms", "clipping": "clipping_ratio",
             "inter_arrival_p95": "inter_arrival_p95_ms", "mel_distance": "mel_distance_db", "hf_drop": "hf_drop_db",
             "drift": "drift_ratio"}  # fmt: skip
PER_RUN = ("eot_to_first_audio_p95", "tts_first_to_publish_p95", "llm_ttft_p95")


def samples(summaries: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in (*PER_RUN, *PER_REPLY)}
    for summary in summaries:
        gates = {g["name"]: g["value"] for g in summary["gates"]}
        for name in PER_RUN:
            if gates.get(name) is not None:
                out[name].append(float(gates[name]))
        for name, field in PER_REPLY.items():
            values = [r[field] for r in summary["replies"] if r["priority"] == "P0" and r[field] is not None]
            out[name] += [abs(v - 1) if name == "drift" else float(v) for v in values]
    return out


def suggest(stats: Mapping[str, Any]) -> float | None:
    if not stats["n"]:
        return None
    x = max(stats["p95"] * 1.2, stats["median"] + 2 * stats["sigma"])
    if x <= 0:
        return 0.0
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return round(math.ceil(x / step) * step, 10)


def table(config: Mapping[str, Any], summaries: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    gates = config.get("e2e", {}).get("gates", {})
    rows = []
    for name, values in samples(summaries).items():
        stats = spread(values)
        gate = gates.get(name, {})
        rows.append({"gate": name, **stats, "threshold": gate.get("threshold"), "op": gate.get("op"),
                     "unit": gate.get("unit", ""), "suggested": suggest(stats)})  # fmt: skip
    lines = ["| gate | n | median | p95 | sigma | now | suggested |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["gate"], r["n"], *(_num(r[k]) for k in ("median", "p95", "sigma")),
                 f"{r['op']} {r['threshold']} {r['unit']}", _num(r["suggested"])]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    verdicts = [s["verdict"] for s in summaries]
    lines.append(f"\nverdicts: {', '.join(verdicts)}")
    return rows, "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
