"""What an e2e run leaves behind: summary.json, summary_brief.json, report.md (PRIMARY KPI
against the baseline on top, gates with suggested fixes, capture status distribution, cases,
replies by ring, latency CDF), replies.csv, and in the output root the history line and the
`latest` link (the tts harness's `report` helpers do the file writing)."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voxgate.regress import plots
from voxgate.regress.gates import GateResult
from voxgate.regress.report import append_history, update_latest, write_json

HISTORY_KEYS = ("eot_to_first_audio_p95", "primary_kpi_regression", "max_gap", "mel_distance", "audio_valid_rate")
RINGS = {
    "transport": (
        "post_rms",
        "max_gap_ms",
        "added_gap_ms",
        "dropouts",
        "clipping_ratio",
        "clicks",
        "inter_arrival_p95_ms",
    ),
    "quality": ("mel_distance_db", "hf_drop_db", "drift_ratio"),
    "latency": ("eot_to_first_audio_ms", "vad_end_to_published_ms", "stt_ms", "llm_ttft_ms", "tts_first_to_publish_ms"),
}


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def brief(summary: Mapping[str, Any]) -> dict[str, Any]:
    gates = summary["gates"]
    return {"verdict": summary["verdict"], "suite": "e2e", "tier": summary["tier"], "date": summary["date"],
            "failed": [g["name"] for g in gates if g["status"] == "FAIL"],
            "warned": [g["name"] for g in gates if g["status"] == "WARN"],
            "values": {g["name"]: g["value"] for g in gates}, "cases": len(summary["cases"]),
            "wall_s": summary["wall_s"], "run_dir": summary["run_dir"]}  # fmt: skip


def history_line(summary: Mapping[str, Any]) -> str:
    values = {g["name"]: g["value"] for g in summary["gates"]}
    failed = ",".join(g["name"] for g in summary["gates"] if g["status"] == "FAIL") or "-"
    numbers = " ".join(f"{k}={_num(values.get(k))}" for k in HISTORY_KEYS)
    return (f"{summary['verdict']} {summary['date']} suite=e2e tier={summary['tier']} cases={len(summary['cases'])} "
            f"{numbers} failed={failed} wall_s={summary['wall_s']} run={summary['run_dir']}")  # fmt: skip


def _kpi_line(summary: Mapping[str, Any]) -> str:
    gates = {g["name"]: g for g in summary["gates"]}
    kpi, delta = gates["eot_to_first_audio_p95"]["value"], gates["primary_kpi_regression"]["value"]
    base = summary["baseline"]
    if base is None:
        return f"**PRIMARY KPI** EoT -> first audio p95: {_num(kpi)} ms (no baseline: `--freeze` makes this run one)"
    forced = " (baseline made under another config: compared with --force)" if base["forced"] else ""
    return (f"**PRIMARY KPI** EoT -> first audio p95: {_num(kpi)} ms; baseline {_num(base['primary_kpi_p95_ms'])} ms "
            f"(frozen {base['frozen_at']}); delta {_num(delta)} ms, fails above +30 ms{forced}")  # fmt: skip


def _gate_table(results: Sequence[GateResult]) -> list[str]:
    rows = ["| gate | status | value | threshold | where |", "|---|---|---|---|---|"]
    for g in results:
        status = f"**{g.status}**" if g.status in ("FAIL", "WARN") else g.status
        rows.append(f"| {g.name} | {status} | {_num(g.value)} {g.unit} | {g.op} {g.threshold:g} | {g.where or '-'} |")
    return rows


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(_num(x) for x in row) + " |" for row in rows]


def markdown(summary: Mapping[str, Any], results: Sequence[GateResult], figures: Mapping[str, str]) -> str:
    replies, m = summary["replies"], summary.get("machine")
    load = f"; load average {m['load_avg_1m']} -> {m['load_avg_1m_after']}" if m else ""
    lines = [f"# voxgate regress e2e: {summary['verdict']}", "", _kpi_line(summary), "",
             f"- tier `{summary['tier']}`, {len(summary['cases'])} cases, server {summary['url']}; "
             f"{summary['date']}, voxgate {summary['version']}, {summary['card']}; wall {summary['wall_s']} s{load}",
             "- the bot is user and probe at once (1:1 WebRTC, no room): post = what it received; "
             "pre = what the agent enqueued on its track (VOXGATE_AGENT_CAPTURE_DIR)"]  # fmt: skip
    if summary.get("inject"):
        lines.append(f"- fault injected on purpose into every reply as heard: `{summary['inject']}`")
    lines += ["", "## Gates", "", *_gate_table(results)]
    failing = [g for g in results if g.status in ("FAIL", "WARN")]
    if failing:
        lines += ["", "## Suggested fixes", ""]
        lines += [f"- **{g.name}** ({_num(g.value)} {g.unit} at {g.where or 'the run'}): check {g.hint}"
                  for g in failing]  # fmt: skip
    counts = Counter(r["capture"] for r in replies)
    lines += ["", "## Capture status", "", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no replies"]
    case_rows = [[c["case_id"], c["priority"], "skipped" if c["skipped"] else c["attempts"], c["replies"],
                  ", ".join(str(s) for s in c["statuses"]) or "-", "yes" if c["audible"] else "no",
                  "; ".join(c["problems"]) or c["skipped"] or c["error"] or "-",
                  _fingerprint(c["fingerprint"])] for c in summary["cases"]]  # fmt: skip
    head = ["case", "prio", "attempts", "replies", "statuses", "heard", "problems / skip reason", "P1 input"]
    lines += ["", "## Cases", "", *_table(head, case_rows)]
    for ring, keys in RINGS.items():
        rows = [[f"{r['case_id']}#{r['reply_seq']}", r["status"], r["capture"], *(r[k] for k in keys)] for r in replies]
        lines += ["", f"## Replies: {ring}", "", *_table(["reply", "status", "capture", *keys], rows)]
    lines += ["", "## Figures", ""] + [f"### {t}\n\n![{t}]({name})\n" for t, name in figures.items()]
    return "\n".join(lines) + "\n"


def _fingerprint(fp: Mapping[str, Any] | None) -> str:
    if not fp:
        return "-"
    return (f"{fp['kind']}: {'shows' if fp['ok'] else '**not seen**'} (spikes {fp['input_spikes']} vs "
            f"{fp['clean_spikes']}, clipping {fp['input_clipping']}, speed {fp['input_speed']})")  # fmt: skip


def write_run(run_dir: Path, summary: dict[str, Any], results: Sequence[GateResult], config: Mapping[str, Any]) -> None:
    latency = [r["eot_to_first_audio_ms"] for r in summary["replies"]
               if r["priority"] == "P0" and r["eot_to_first_audio_ms"] is not None]  # fmt: skip
    threshold = config.get("e2e", {}).get("gates", {}).get("eot_to_first_audio_p95", {}).get("threshold")
    figures = {}
    if latency:
        path = plots.latency_cdf(latency, threshold, run_dir / "eot_to_first_audio_cdf.png")
        figures["EoT -> first audio at the probe (CDF, P0 replies)"] = path.name
    write_json(run_dir / "summary.json", summary)
    write_json(run_dir / "summary_brief.json", brief(summary))
    (run_dir / "report.md").write_text(markdown(summary, results, figures), encoding="utf-8")
    if summary["replies"]:
        with open(run_dir / "replies.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(summary["replies"][0]))
            writer.writeheader()
            writer.writerows(summary["replies"])


def record(root: Path, run_dir: Path, summary: Mapping[str, Any]) -> None:
    append_history(root, history_line(summary))
    update_latest(root, run_dir)
