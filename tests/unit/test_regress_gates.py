"""Every tts gate both ways: a good recording passes all of them, and each fault made on
purpose fails the gate that exists for it (voxgate.regress.gates, .measure, .faults)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.regress_audio import GOOD
from voxgate.regress import faults
from voxgate.regress.gates import Gate, GateConfigError, evaluate, failed, load_gates, read_config, verdict
from voxgate.regress.measure import CaseRecording, gate_metrics, measure_case
from voxgate.regress.report import brief, history_line
from voxgate.regress.stability import suggest, table

CONFIG = read_config()


def _gates(engine: str | None = None) -> list[Gate]:
    return load_gates(CONFIG, "tts", engine)


def _judge(runs: list[np.ndarray], sr: int, golden: np.ndarray, offline: np.ndarray, ttfa_s: float = 0.05):
    rec = CaseRecording("case", sr, runs, [ttfa_s] * len(runs), [0.5] * len(runs), offline)
    case = measure_case(rec, golden)
    values, where = gate_metrics([case])
    return evaluate(values, _gates(), where)


@pytest.fixture(params=sorted(GOOD))
def good(request: pytest.FixtureRequest) -> tuple[np.ndarray, int]:
    return GOOD[request.param]()


def test_the_packaged_config_has_every_gate_and_engine_overrides():
    names = [g.name for g in _gates()]
    assert names == ["audio_valid", "determinism", "snr_vs_golden", "duration_vs_golden", "ttfa_p95",
                     "stream_vs_offline", "repeat", "pop_click", "clipping", "max_silence_gap"]  # fmt: skip
    by_name = {g.name: g for g in _gates()}
    assert by_name["snr_vs_golden"].threshold == 15.0 and by_name["snr_vs_golden"].op == ">="
    assert by_name["stream_vs_offline"].threshold == 50.0
    assert {g.name: g for g in _gates("piper")}["ttfa_p95"].threshold > by_name["ttfa_p95"].threshold
    qwen3 = {"cuda": load_gates(CONFIG, "tts", "qwen3", "cuda"), "cpu": load_gates(CONFIG, "tts", "qwen3", "cpu")}
    assert qwen3["cuda"][4].threshold == 350.0 and qwen3["cpu"][4].threshold > 350.0
    assert all(g.hint for g in _gates())
    assert CONFIG["tts"]["modes"]["fast"]["runs"] >= 2


def test_a_good_recording_passes_every_gate(good):
    x, sr = good
    results = _judge([x.copy() for _ in range(3)], sr, golden=x, offline=x)
    assert verdict(results) == "PASS"
    assert [r.name for r in results if r.status != "PASS"] == []


@pytest.mark.parametrize("fault", sorted(faults.FAULTS))
def test_each_fault_fails_its_gate(good, fault):
    x, sr = good
    bad = [faults.FAULTS[fault](x, sr) for _ in range(3)]
    results = _judge(bad, sr, golden=x, offline=x)
    assert verdict(results) == "FAIL"
    assert faults.EXPECTED_GATE[fault] in failed(results)


@pytest.mark.parametrize(
    ("fault", "only"),
    [("spike", {"pop_click"}), ("clip", {"clipping", "snr_vs_golden"}), ("nan", {"audio_valid"})],
)
def test_a_fault_fails_no_unrelated_gate(good, fault, only):
    x, sr = good
    results = _judge([faults.FAULTS[fault](x, sr) for _ in range(3)], sr, golden=x, offline=x)
    assert set(failed(results)) <= only and faults.EXPECTED_GATE[fault] in failed(results)


def test_one_differing_run_fails_determinism_only(good):
    x, sr = good
    other = x.copy()
    other[len(x) // 2] += 3 / 32767
    results = _judge([x, x.copy(), other], sr, golden=x, offline=x)
    assert failed(results) == ["determinism"]


def test_a_stream_longer_than_its_offline_synthesis_fails_stream_vs_offline(good):
    x, sr = good
    longer = np.concatenate([x, np.zeros(round(0.08 * sr), dtype=x.dtype)])
    assert "stream_vs_offline" in failed(_judge([longer] * 3, sr, golden=longer, offline=x))
    assert "stream_vs_offline" not in failed(_judge([x] * 3, sr, golden=x, offline=x[: len(x) - sr // 50]))


def test_slow_first_audio_fails_ttfa(good):
    x, sr = good
    results = _judge([x] * 3, sr, golden=x, offline=x, ttfa_s=0.9)
    assert failed(results) == ["ttfa_p95"]


def test_an_engine_error_fails_audio_valid_and_skips_the_audio_gates():
    rec = CaseRecording("case", 24000, [], [], [], error="EngineFailure: boom")
    case = measure_case(rec)
    values, where = gate_metrics([case])
    results = {r.name: r for r in evaluate(values, _gates(), where)}
    assert results["audio_valid"].status == "FAIL" and results["audio_valid"].where == "case"
    assert results["repeat"].status == "SKIP" and results["determinism"].status == "SKIP"


def test_without_a_golden_baseline_the_golden_gates_skip(good):
    x, sr = good
    rec = CaseRecording("case", sr, [x] * 2, [0.01] * 2, [0.1] * 2, x)
    values, where = gate_metrics([measure_case(rec)])
    results = {r.name: r for r in evaluate(values, _gates(), where)}
    assert results["snr_vs_golden"].status == "SKIP" and results["duration_vs_golden"].status == "SKIP"
    assert verdict(list(results.values())) == "PASS"


def test_evaluate_applies_each_operator_and_skips_missing_values():
    gates = [Gate("a", "<=", 1.0), Gate("b", ">=", 15.0), Gate("c", "<", 0.3), Gate("d", "==", 0.0)]
    results = evaluate({"a": 1.0, "b": 14.9, "c": 0.3}, gates)
    assert [r.status for r in results] == ["PASS", "FAIL", "FAIL", "SKIP"]
    assert not results[1].passed and results[3].passed


def test_a_bad_gate_config_is_refused_clearly():
    with pytest.raises(GateConfigError, match="op"):
        load_gates({"tts": {"gates": {"x": {"op": "~", "threshold": 1}}}}, "tts")
    with pytest.raises(GateConfigError, match="unknown gates: nope"):
        load_gates({"tts": {"gates": {"x": {"op": "<=", "threshold": 1}}, "engines": {"e": {"gates": {"nope": 2}}}}},
                   "tts", "e")  # fmt: skip
    with pytest.raises(GateConfigError, match="no gates"):
        load_gates({}, "tts")


def _summary(verdict_: str, values: dict[str, float | None], cases: list[dict]) -> dict:
    gates = [{"name": k, "value": v, "status": "PASS" if verdict_ == "PASS" else "FAIL"} for k, v in values.items()]
    return {"verdict": verdict_, "suite": "tts", "engine": "tone", "mode": "fast", "date": "2026-01-01T00:00:00+00:00",
            "gates": gates, "cases": cases, "wall_s": 1.0, "run_dir": "r"}  # fmt: skip


def test_history_line_and_brief_carry_the_verdict_engine_date_and_numbers():
    summary = _summary("FAIL", {"pop_click": 245.9, "ttfa_p95": 3.2}, [])
    line = history_line(summary)
    assert line.startswith("FAIL 2026-01-01") and "engine=tone" in line and "pop_click=245.9" in line
    assert "failed=pop_click,ttfa_p95" in line
    assert brief(summary)["failed"] == ["pop_click", "ttfa_p95"]


def test_stability_suggests_from_the_spread_and_keeps_hard_limits():
    fixed = {"problems": [], "stream_vs_offline_ms": 0.0, "max_silence_gap_s": 0.3, "repeat_s": 0.0, "clipping": 0.0,
             "snr_vs_golden_db": 120.0, "unique_hashes": 1}  # fmt: skip
    cases = [{**fixed, "pop_click": v} for v in (5, 6, 7)]
    runs = [_summary("PASS", {"ttfa_p95": t}, cases) for t in (100.0, 110.0, 120.0)]
    rows, text = table(_gates(), runs)
    by_gate = {r["gate"]: r for r in rows}
    assert by_gate["ttfa_p95"]["median"] == 110.0 and by_gate["ttfa_p95"]["n"] == 3
    assert by_gate["ttfa_p95"]["suggested"] == pytest.approx(150.0)  # p95 119 x 1.2 = 142.8, rounded up
    assert by_gate["pop_click"]["suggested"] == pytest.approx(8.4)  # p95 7 x 1.2 over 9 texts
    assert by_gate["determinism"]["suggested"] == 1.0 and "hard" in by_gate["determinism"]["method"]
    assert "| ttfa_p95 | 3 |" in text
    assert suggest(Gate("ttfa_p95", "<=", 350.0), {"n": 0})[0] == 350.0
