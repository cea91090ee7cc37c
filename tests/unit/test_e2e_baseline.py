"""regress e2e: the PRIMARY KPI's baseline (freeze, refuse across configs) and the report's
suggested fixes and history line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from voxgate.regress.e2e import baseline, judge, report
from voxgate.regress.e2e.runner import GATES_FILE
from voxgate.regress.gates import read_config, verdict
from voxgate.regress.golden import BaselineMismatch
from voxgate.types import InvalidRequest

CONFIG = {"tier": "mini", "cases": ["a"], "cases_sha": "x", "server": "spawned"}


def _summary(run_dir: Path, kpi_ms: float, audible: bool = True) -> tuple[dict, list]:
    case = judge.CaseResult("a", "P0", attempts=1, audible=audible)
    values, where = judge.gate_values([case], [], None)
    values["eot_to_first_audio_p95"] = kpi_ms
    results = judge.judge(values, where, read_config(GATES_FILE))
    summary = {"suite": "e2e", "verdict": verdict(results), "date": "2026-11-26T12:00:00+00:00", "tier": "mini",
               "version": "0.1.0", "config": CONFIG, "config_id": baseline.config_id(CONFIG), "card": "cpu",
               "url": "spawned", "inject": None, "baseline": None, "gates": [dataclasses.asdict(r) for r in results],
               "cases": [dataclasses.asdict(case)], "replies": [], "wall_s": 1.0, "run_dir": str(run_dir)}  # fmt: skip
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return summary, results


def test_a_passing_run_is_frozen_and_a_failing_one_only_when_forced(tmp_path: Path) -> None:
    _summary(tmp_path / "good", 2000.0)
    meta = baseline.freeze(tmp_path / "good", tmp_path / "golden")
    assert meta["primary_kpi_p95_ms"] == 2000.0 and meta["config_id"] == baseline.config_id(CONFIG)
    _summary(tmp_path / "bad", 2000.0, audible=False)
    with pytest.raises(InvalidRequest, match="audio_valid_rate"):
        baseline.freeze(tmp_path / "bad", tmp_path / "golden")
    assert baseline.freeze(tmp_path / "bad", tmp_path / "golden", force=True)["primary_kpi_p95_ms"] == 2000.0


def test_a_baseline_made_under_another_config_is_refused_unless_forced(tmp_path: Path) -> None:
    _summary(tmp_path / "run", 2000.0)
    baseline.freeze(tmp_path / "run", tmp_path / "golden")
    assert baseline.load_baseline(tmp_path / "golden", CONFIG)["forced"] is False  # type: ignore[index]
    other = {**CONFIG, "tier": "fast"}
    with pytest.raises(BaselineMismatch, match="tier: 'mini' -> 'fast'"):
        baseline.load_baseline(tmp_path / "golden", other)
    assert baseline.load_baseline(tmp_path / "golden", other, force=True)["forced"] is True  # type: ignore[index]
    assert baseline.load_baseline(tmp_path / "none", CONFIG) is None


def test_the_report_puts_the_kpi_first_and_a_fix_under_each_failure(tmp_path: Path) -> None:
    summary, results = _summary(tmp_path / "run", 2000.0, audible=False)
    summary["machine"] = {"load_avg_1m": 3.5, "load_avg_1m_after": 4.2}
    text = report.markdown(summary, results, {})
    assert "load average 3.5 -> 4.2" in text  # what the latency was measured under
    assert text.splitlines()[0] == "# voxgate regress e2e: FAIL"
    assert "**PRIMARY KPI** EoT -> first audio p95: 2000 ms (no baseline" in text
    fixes = text.split("## Suggested fixes")[1].split("##")[0]
    assert "**audio_valid_rate**" in fixes and "check the agent's track" in fixes
    line = report.history_line(summary)
    assert line.startswith("FAIL 2026-11-26") and "eot_to_first_audio_p95=2000" in line
    assert "failed=audio_valid_rate" in line


def test_stability_pools_reply_and_run_numbers_and_suggests_thresholds_from_their_spread() -> None:
    from voxgate.regress.e2e import stability

    def summary(kpi: float, gaps: list[float]) -> dict:
        replies = [{"priority": "P0", "max_gap_ms": g, "drift_ratio": 0.99} for g in gaps]
        replies.append({"priority": "P1", "max_gap_ms": 5000.0, "drift_ratio": 1.5})  # P1 is not calibrated
        for r in replies:
            r.update({k: None for k in stability.PER_REPLY.values() if k not in r})
        return {"verdict": "PASS", "gates": [{"name": "eot_to_first_audio_p95", "value": kpi}], "replies": replies}

    rows, text = stability.table(read_config(GATES_FILE), [summary(2000, [100, 300]), summary(2400, [200, 400])])
    by_gate = {r["gate"]: r for r in rows}
    assert by_gate["eot_to_first_audio_p95"]["n"] == 2 and by_gate["max_gap"]["n"] == 4
    assert by_gate["max_gap"]["max"] == 400 and by_gate["drift"]["median"] == pytest.approx(0.01)
    assert by_gate["eot_to_first_audio_p95"]["suggested"] >= 2400 * 1.2 * 0.99  # p95 x 1.2, rounded up
    assert by_gate["mel_distance"]["suggested"] is None and "verdicts: PASS, PASS" in text
