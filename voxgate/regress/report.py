"""What a regression run leaves behind: summary.json, summary_brief.json, report.md, the
history line, the `latest` link. Building each text is pure; `write_*` do the file I/O."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from voxgate.regress.gates import GateResult

HISTORY_FILE = "history.log"
LATEST = "latest"


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return f"{text} {unit}".strip()


def brief(summary: dict[str, Any]) -> dict[str, Any]:
    """The few numbers a dashboard or a CI log wants."""
    gates = {g["name"]: g for g in summary["gates"]}
    return {
        "verdict": summary["verdict"],
        "suite": summary["suite"],
        "engine": summary["engine"],
        "mode": summary["mode"],
        "date": summary["date"],
        "failed": [g["name"] for g in summary["gates"] if g["status"] == "FAIL"],
        "skipped": [g["name"] for g in summary["gates"] if g["status"] == "SKIP"],
        "values": {name: g["value"] for name, g in gates.items()},
        "cases": len(summary["cases"]),
        "wall_s": summary["wall_s"],
        "run_dir": summary["run_dir"],
    }


def history_line(summary: dict[str, Any]) -> str:
    """One line per run: verdict, key numbers, date, engine (grep-able, like the seeds' log)."""
    values = {g["name"]: g["value"] for g in summary["gates"]}
    failed = ",".join(g["name"] for g in summary["gates"] if g["status"] == "FAIL") or "-"
    keys = ("snr_vs_golden", "ttfa_p95", "stream_vs_offline", "repeat", "pop_click", "determinism")
    numbers = " ".join(f"{k}={_fmt(values.get(k))}" for k in keys)
    return (f"{summary['verdict']} {summary['date']} engine={summary['engine']} mode={summary['mode']} "
            f"cases={len(summary['cases'])} {numbers} failed={failed} run={summary['run_dir']}")  # fmt: skip


def _gate_rows(gates: Sequence[GateResult]) -> list[str]:
    rows = ["| gate | status | value | threshold | worst case |", "|---|---|---|---|---|"]
    for g in gates:
        mark = {"PASS": "PASS", "FAIL": "**FAIL**", "SKIP": "SKIP"}[g.status]
        rows.append(f"| {g.name} | {mark} | {_fmt(g.value, g.unit)} | {g.op} {g.threshold:g} {g.unit} | {g.where} |")
    return rows


def _case_rows(cases: Sequence[dict[str, Any]]) -> list[str]:
    head = (
        "| text | duration s | TTFA ms (min) | RTF | SNR vs golden dB | repeat s | click | gap s | problems | failed |"
    )
    rows = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        cells = [c["case_id"], _fmt(c["duration_s"]), _fmt(min(c["ttfa_ms"], default=None)), _fmt(c["rtf"]),
                 _fmt(c["snr_vs_golden_db"]), _fmt(c["repeat_s"]), _fmt(c["pop_click"]),
                 _fmt(c["max_silence_gap_s"]), ", ".join(c["problems"]) or "-",
                 ", ".join(c.get("failed", [])) or "-"]  # fmt: skip
        rows.append("| " + " | ".join(str(x) for x in cells) + " |")
    return rows


def markdown(summary: dict[str, Any], gates: Sequence[GateResult], figures: dict[str, str]) -> str:
    """report.md: verdict, gates (with the suggested fix of each failure), texts, figures."""
    golden = summary["golden"]
    base = "none yet (`voxgate regress freeze` makes this run one)" if golden is None else (
        f"`{golden['path']}` (frozen {golden['frozen_at']}, voxgate {golden['version']}, {golden['card']})"
        + (" **compared with --force: made under another config**" if golden["forced"] else ""))  # fmt: skip
    lines = [
        f"# voxgate regress tts: {summary['verdict']}",
        "",
        f"- engine `{summary['engine']}`, voice `{summary['config']['voice']}`, mode `{summary['mode']}`, "
        f"{summary['runs']} runs per text; config `{summary['config_id']}`",
        f"- {summary['date']}, voxgate {summary['version']}, card: {summary['card']}; wall {summary['wall_s']} s"
        + (f"; {m['cores']} cores, load {m['load_avg_1m']}" if (m := summary.get("machine")) else ""),
        f"- golden baseline: {base}",
    ]
    if summary.get("inject"):
        lines.append(f"- fault injected on purpose: `{summary['inject']}`")
    if summary["skipped"]:
        lines.append("- skipped: " + "; ".join(f"{s['id']} ({s['reason']})" for s in summary["skipped"]))
    lines += ["", "## Gates", "", *_gate_rows(gates)]
    failures = [g for g in gates if g.status == "FAIL"]
    if failures:
        lines += ["", "## Suggested fixes", ""]
        lines += [
            f"- **{g.name}** ({_fmt(g.value, g.unit)} at {g.where or 'the run'}): check {g.hint}" for g in failures
        ]
    lines += ["", "## Texts", "", *_case_rows(summary["cases"]), "", "## Figures", ""]
    lines += [f"### {title}\n\n![{title}]({name})\n" for title, name in figures.items()]
    return "\n".join(lines) + "\n"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=_jsonable) + "\n")


def write_stability(root: Path, title: str, table: str, result: dict[str, Any]) -> None:
    """A stability run's `stability.json` and `stability.md` (the table, also printed)."""
    root.mkdir(parents=True, exist_ok=True)
    write_json(root / "stability.json", result)
    (root / "stability.md").write_text(f"# {title}\n\n{table}\n")
    print(table)
    print(f"wrote {root}/stability.md")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def append_history(root: Path, line: str) -> None:
    with open(root / HISTORY_FILE, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def update_latest(root: Path, run_dir: Path) -> None:
    """Point `root/latest` at `run_dir` (relative, swapped in atomically)."""
    tmp = root / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(run_dir, root))
    os.replace(tmp, root / LATEST)
