"""From cases and replies to the gates' numbers, and to the verdict (pure).

Each gate's number comes with where it was found (`case#reply`), so a failure points at a
call. P0 replies feed the transport, quality and latency gates; P1 cases (anomalous user
audio) feed only the `p1_` gates. Gates marked `severity = "warn"` in the threshold file are
reported as WARN and do not fail the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from voxgate.regress import signals
from voxgate.regress.e2e.cases import Case
from voxgate.regress.e2e.metrics import ReplyMetrics
from voxgate.regress.gates import Gate, GateResult, evaluate, load_gates

SUITE = "e2e"


@dataclass(slots=True)
class CaseResult:
    case_id: str
    priority: str
    attempts: int = 0
    skipped: str | None = None
    error: str | None = None  # the last attempt's call error
    retried_because: str | None = None  # what the first attempt's capture lacked
    call_id: str | None = None
    replies: int = 0  # reply.start events of the kept attempt
    statuses: list[str | None] = field(default_factory=list)
    audible: bool = False
    problems: list[str] = field(default_factory=list)  # expectations not met
    answered_once: bool | None = None  # for a case that expects it (a multi-sentence question)
    fingerprint: dict[str, Any] | None = None  # P1: the anomaly as measured in the user's audio


def expectation_problems(case: Case, statuses: Sequence[str | None], dropped: Sequence[str]) -> list[str]:
    """What the call did that the case did not expect (empty = as expected)."""
    problems = []
    if len(statuses) < case.expected_replies:
        problems.append(f"{len(statuses)} of {case.expected_replies} replies" +
                        (f" (turns dropped: {', '.join(dropped)})" if dropped else ""))  # fmt: skip
    if any(s is None for s in statuses):
        problems.append("a reply never ended")
    if case.expect.get("first_cut") and statuses and statuses[0] == "completed":
        problems.append("the barge-in did not cut the first reply")
    if any(s == "failed" for s in statuses):
        problems.append("a reply failed")
    return problems


def answered_once(reply_starts: Sequence[float], words_end: float) -> bool:
    """Exactly one reply heard (`reply_starts`: the starts of replies whose audio went out; one
    cancelled before any did was never heard), started after the user's last word: a reply heard
    from a pause inside a multi-sentence question answers part of it, and the rest gets another."""
    return len(reply_starts) == 1 and reply_starts[0] >= words_end


def fingerprint(case: Case, clean: np.ndarray, sent: np.ndarray, rate: int, clip_gate: float) -> dict[str, Any]:
    """A P1 anomaly as measured in the user's audio (`clean`: the words before it, padded
    the same way), and whether it shows (`ok`)."""
    kind = case.anomaly.kind if case.anomaly else None
    out: dict[str, Any] = {"kind": kind, "input_spikes": signals.spikes(sent, rate).count,
                           "clean_spikes": signals.spikes(clean, rate).count,
                           "input_clipping": round(signals.clipping_ratio(sent), 5),
                           "input_speed": round(len(clean) / max(len(sent), 1), 4)}  # fmt: skip
    if kind == "spike":
        out["ok"] = out["input_spikes"] > out["clean_spikes"]
    elif kind == "speed":
        out["ok"] = abs(out["input_speed"] - 1) > 0.02
    elif kind == "distort":
        out["ok"] = out["input_clipping"] > clip_gate
    else:
        out["ok"] = True
    return out


def _worst(rows: list[tuple[float, str]], largest: bool = True) -> tuple[float | None, str]:
    if not rows:
        return None, ""
    value, where = max(rows) if largest else min(rows)
    return value, where


def _p95(rows: list[tuple[float, str]]) -> tuple[float | None, str]:
    if not rows:
        return None, ""
    values = [v for v, _ in rows]
    return round(float(np.percentile(values, 95)), 1), f"{len(values)} replies, worst {max(rows)[1]}"


def gate_values(cases: Sequence[CaseResult], replies: Sequence[ReplyMetrics],
                baseline_kpi_ms: float | None) -> tuple[dict[str, float | None], dict[str, str]]:  # fmt: skip
    """Every gate's number (None = not measurable) and where it was found."""
    p0 = [c for c in cases if c.priority == "P0" and c.skipped is None]
    p1 = [c for c in cases if c.priority == "P1" and c.skipped is None]
    rows = [r for r in replies if r.priority == "P0"]

    def of(name: str, transform: Any = None) -> list[tuple[float, str]]:
        out = []
        for r in rows:
            v = getattr(r, name)
            if v is not None:
                out.append((transform(v) if transform else float(v), f"{r.case_id}#{r.reply_seq}"))
        return out

    values: dict[str, float | None] = {}
    where: dict[str, str] = {}

    def put(name: str, pair: tuple[float | None, str]) -> None:
        values[name], where[name] = pair

    put("audio_valid_rate", (sum(c.audible for c in p0) / len(p0) if p0 else None,
                             ", ".join(c.case_id for c in p0 if not c.audible)))  # fmt: skip
    put("case_expectations", (float(sum(bool(c.problems) for c in p0)) if p0 else None,
                              ", ".join(c.case_id for c in p0 if c.problems)))  # fmt: skip
    once = [c for c in p0 if c.answered_once is not None]
    put("multi_answered_once_rate", (sum(bool(c.answered_once) for c in once) / len(once) if once else None,
                                     ", ".join(c.case_id for c in once if not c.answered_once)))  # fmt: skip
    put("eot_to_first_audio_p95", _p95(of("eot_to_first_audio_ms")))
    kpi = values["eot_to_first_audio_p95"]
    put("primary_kpi_regression", (round(kpi - baseline_kpi_ms, 1) if kpi is not None and baseline_kpi_ms is not None
                                   else None, f"baseline {baseline_kpi_ms} ms" if baseline_kpi_ms else ""))  # fmt: skip
    put("tts_first_to_publish_p95", _p95(of("tts_first_to_publish_ms")))
    put("llm_ttft_p95", _p95(of("llm_ttft_ms")))
    put("max_gap", _worst(of("max_gap_ms")))
    put("added_gap", _worst(of("added_gap_ms")))
    dropouts, clicks = of("dropouts"), of("clicks")
    put("audible_dropouts", (sum(v for v, _ in dropouts) if dropouts else None,
                             ", ".join(w for v, w in dropouts if v)))  # fmt: skip
    put("clipping", _worst(of("clipping_ratio")))
    put("pop_click", (sum(v for v, _ in clicks) if clicks else None, ", ".join(w for v, w in clicks if v)))
    put("inter_arrival_p95", _worst(of("inter_arrival_p95_ms")))
    put("mel_distance", _worst(of("mel_distance_db")))
    put("hf_drop", _worst(of("hf_drop_db")))
    put("drift", _worst(of("drift_ratio", lambda v: abs(v - 1))))
    heard = [r for r in rows if r.capture in ("OK", "PRE_MISSING")]
    captured = [r for r in heard if r.capture == "OK"]
    uncaptured = ", ".join(f"{r.case_id}#{r.reply_seq}" for r in heard if r.capture != "OK")
    put("pre_capture_coverage", (len(captured) / len(heard) if heard and captured else None, uncaptured))
    ran = [c for c in cases if c.skipped is None]
    put("retry_rate", (sum(c.attempts > 1 for c in ran) / len(ran) if ran else None,
                       ", ".join(c.case_id for c in ran if c.attempts > 1)))  # fmt: skip
    missing = [c.case_id for c in p1 if c.fingerprint is not None and not c.fingerprint["ok"]]
    put("p1_input_fingerprints", (float(len(missing)) if p1 else None, ", ".join(missing)))
    put("p1_audio_valid_rate", (sum(c.audible for c in p1) / len(p1) if p1 else None,
                                ", ".join(c.case_id for c in p1 if not c.audible)))  # fmt: skip
    return values, where


def gates(config: Mapping[str, Any]) -> tuple[list[Gate], set[str]]:
    """The e2e gates and the names of those that only warn."""
    table = config.get(SUITE, {}).get("gates", {})
    return load_gates(config, SUITE), {name for name, raw in table.items() if raw.get("severity") == "warn"}


def judge(values: Mapping[str, float | None], where: Mapping[str, str], config: Mapping[str, Any]) -> list[GateResult]:
    """Gate results; a failed warn-only gate has status WARN (it does not fail the run)."""
    gate_list, warn = gates(config)
    results = evaluate(values, gate_list, where)
    return [replace(r, status="WARN") if r.status == "FAIL" and r.name in warn else r for r in results]  # type: ignore[arg-type]
