"""`voxgate regress e2e`: cases -> real calls -> metrics -> gates -> the run folder.

Starts `voxgate serve` (the CPU defaults: Piper, embedded SmolLM2, whisper tiny.en) with the
agent's traces and pre-transport captures going into the run folder, or calls a running
server (`url`; give its capture and trace dirs when they are on this machine, else the
quality gates SKIP and latency comes from the `turn.trace` events). Every case is a fresh
call; a case whose capture was silent (nothing heard, or a reply with engine audio that
never arrived) is run once more and the second attempt kept (`retry_rate`).

Run folder (under `root`, default `regress/e2e`): summary.json, summary_brief.json,
report.md, replies.csv, user/ (what the bot said), post/ (each reply as heard), pre/ (the
engine's output per trace id, when spawned), traces/, events/ (each call's data channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voxgate import __version__
from voxgate.audio import decode_wav, wav_bytes
from voxgate.bench.stats import machine
from voxgate.regress.e2e import baseline, inject, judge, metrics, probe, report
from voxgate.regress.e2e.call import CallRecording, run_call
from voxgate.regress.e2e.cases import CASES_FILE, Case, load_cases, select
from voxgate.regress.e2e.speech import Utterance, piper_voice, prepare, utterances
from voxgate.regress.gates import GateResult, read_config, verdict

DEFAULT_ROOT = Path("regress/e2e")
GATES_FILE = Path(__file__).parent / "gates.toml"
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class E2eRun:
    """What an e2e run is asked to do."""

    tier: str = "mini"
    turns: int = 20  # nightly: fresh calls
    only: tuple[str, ...] = ()  # case ids (default: the tier's)
    url: str | None = None  # a running server instead of spawning one
    server_env: tuple[tuple[str, str], ...] = ()  # VOXGATE_* settings (no prefix) of the spawned server
    capture_dir: Path | None = None  # that server's VOXGATE_AGENT_CAPTURE_DIR
    trace_dir: Path | None = None  # that server's VOXGATE_AGENT_TRACE_DIR
    root: Path = DEFAULT_ROOT
    cases_file: Path | None = None
    gates_file: Path | None = None
    baseline: Path | None = None  # default: root/golden/e2e
    force: bool = False
    retry: bool = True
    inject: str | None = None  # a heard-audio fault (inject.HEARD_FAULTS), the harness's self-test
    record: bool = True  # history line and `latest`


def run_e2e(options: E2eRun, progress: Progress) -> tuple[dict[str, Any], list[GateResult]]:
    started = time.perf_counter()
    config_file = read_config(options.gates_file or GATES_FILE)
    cases = select(load_cases(options.cases_file), options.tier, options.turns, list(options.only) or None)
    config = run_config(options, cases)
    base = baseline.load_baseline(options.baseline or baseline.baseline_dir(options.root), config, options.force)
    progress(f"{len(cases)} cases ({options.tier}); baseline: {base['source_run'] if base else 'none'}")
    stamp, load_before = datetime.now(UTC), machine()
    run_dir = _new_run_dir(options.root, f"{stamp:%Y%m%d-%H%M%S}_{options.tier}")
    voice = piper_voice()
    said = {c.id: utterances(c, voice) for c in cases if c.skip is None}
    _write_user(run_dir, said)
    with _server(options, run_dir, progress) as (url, capture_dir, trace_dir):
        recordings = asyncio.run(_calls(url, cases, said, options.retry, progress))
    case_results, replies = [], []
    clip_gate = float(config_file["e2e"]["gates"]["clipping"]["threshold"])
    for case in cases:
        if case.anomaly is not None and case.id in said:
            clean = prepare(voice(case.steps[0].text)[0], said[case.id][0].sample_rate,
                            dataclasses.replace(case, anomaly=None))  # fmt: skip
            fingerprint = judge.fingerprint(case, clean.samples, said[case.id][0].samples, clean.sample_rate, clip_gate)
        else:
            fingerprint = None
        result, rows = _measure(case, recordings.get(case.id, []), capture_dir, trace_dir, options.inject, run_dir)
        result.fingerprint = fingerprint
        case_results.append(result)
        replies += rows
    values, where = judge.gate_values(case_results, replies, base["primary_kpi_p95_ms"] if base else None)
    results = judge.judge(values, where, config_file)
    summary = {
        "suite": "e2e", "verdict": verdict(results), "date": stamp.isoformat(timespec="seconds"),
        "tier": options.tier, "version": __version__, "config": config, "config_id": baseline.config_id(config),
        "card": _card(), "url": options.url or "spawned", "inject": options.inject,
        "machine": {**load_before, "load_avg_1m_after": machine()["load_avg_1m"]},  # what latency was measured under
        "baseline": None if base is None else {k: base.get(k) for k in ("source_run", "frozen_at", "version",
                                                                          "card", "primary_kpi_p95_ms", "forced")},
        "gates": [dataclasses.asdict(r) for r in results],
        "cases": [dataclasses.asdict(c) for c in case_results],
        "replies": [dataclasses.asdict(r) for r in replies],
        "wall_s": round(time.perf_counter() - started, 1), "run_dir": str(run_dir),
    }  # fmt: skip
    report.write_run(run_dir, summary, results, config_file)
    if options.record:
        report.record(options.root, run_dir, summary)
    return summary, results


def run_config(options: E2eRun, cases: list[Case]) -> dict[str, Any]:
    """What a baseline must share with a run for their KPIs to be comparable."""
    source = options.cases_file or CASES_FILE
    return {"tier": options.tier, "cases": [c.id for c in cases],
            "cases_sha": hashlib.sha256(source.read_bytes()).hexdigest()[:12],
            "server": "url" if options.url else "spawned: piper, embedded SmolLM2, whisper tiny.en",
            "server_env": dict(options.server_env)}  # fmt: skip


def _card() -> str:
    info = machine()
    return f"{info['cpu'] or 'cpu'} ({info['cores']} cores)"


def _new_run_dir(root: Path, name: str) -> Path:
    path, n = root / name, 1
    while path.exists():
        n += 1
        path = root / f"{name}-{n}"
    for sub in ("user", "post", "events"):
        (path / sub).mkdir(parents=True)
    return path


def _write_user(run_dir: Path, said: dict[str, list[Utterance]]) -> None:
    for case_id, utts in said.items():
        for i, u in enumerate(utts):
            (run_dir / "user" / f"{case_id}_{i}.wav").write_bytes(wav_bytes(u.samples, u.sample_rate))


@contextlib.contextmanager
def _server(options: E2eRun, run_dir: Path, progress: Progress) -> Iterator[tuple[str, Path | None, Path | None]]:
    """(url, capture dir, trace dir) of the server the calls go to, spawned for the run
    (and stopped after it) unless `options.url` names one."""
    if options.url:
        yield options.url.rstrip("/"), options.capture_dir, options.trace_dir
        return
    from voxgate.bench.server import ServerProcess

    pre, traces = run_dir / "pre", run_dir / "traces"
    env = {"LLM_EMBEDDED": "true", **dict(options.server_env), "AGENT_CAPTURE_DIR": str(pre),
           "AGENT_TRACE_DIR": str(traces)}  # fmt: skip
    t0 = time.perf_counter()
    with ServerProcess("piper", env=env) as server:
        progress(f"server ready at {server.url} in {time.perf_counter() - t0:.1f} s")
        yield server.url, pre, traces


async def _calls(url: str, cases: list[Case], said: dict[str, list[Utterance]], retry: bool,
                 progress: Progress) -> dict[str, list[CallRecording]]:  # fmt: skip
    out: dict[str, list[CallRecording]] = {}
    for i, case in enumerate(cases, 1):
        if case.skip is not None:
            progress(f"[{i}/{len(cases)}] {case.id}: skipped ({case.skip})")
            continue
        attempts = [await run_call(url, case, said[case.id])]
        if retry and (why := _silent(attempts[-1])):
            progress(f"[{i}/{len(cases)}] {case.id}: {why}, calling again")
            attempts.append(await run_call(url, case, said[case.id], attempt=2))
        rec = attempts[-1]
        ends = [e.get("status") for _, e in rec.events if e.get("type") == "reply.end"]
        progress(f"[{i}/{len(cases)}] {case.id}: replies {ends}{' error ' + rec.error if rec.error else ''}")
        out[case.id] = attempts
    return out


def _silent(rec: CallRecording) -> str | None:
    """Why the call's capture was silent (worth one more call), or None."""
    if not any(e.get("type") == "reply.start" for _, e in rec.events):
        return f"no reply{': ' + rec.error if rec.error else ''}"
    return None if probe.call_audible(rec) else "nothing heard"


def _measure(case: Case, attempts: list[CallRecording], capture_dir: Path | None, trace_dir: Path | None,
             fault: str | None, run_dir: Path) -> tuple[judge.CaseResult, list[metrics.ReplyMetrics]]:  # fmt: skip
    """The case's result and its replies' metrics, from its last attempt (files into run_dir)."""
    result = judge.CaseResult(case.id, case.priority, attempts=len(attempts), skipped=case.skip)
    if not attempts:
        return result, []
    for n, rec in enumerate(attempts, 1):  # the kept attempt as <case>.json, earlier ones beside it
        name = f"{case.id}.json" if n == len(attempts) else f"{case.id}.attempt{n}.json"
        (run_dir / "events" / name).write_text(json.dumps([{"t": t, **e} for t, e in rec.events], indent=1))
    if len(attempts) > 1:
        result.retried_because = _silent(attempts[0])
    rec = attempts[-1]
    result.error, result.call_id, result.audible = rec.error, rec.call_id, probe.call_audible(rec)
    takes = probe.replies(rec)
    result.replies, result.statuses = len(takes), [t.status for t in takes]
    dropped = [str(e.get("reason")) for _, e in rec.events if e.get("type") == "turn.dropped"]
    result.problems = judge.expectation_problems(case, result.statuses, dropped)
    if case.expect.get("answered_once") and rec.said:
        heard = {e.get("trace_id") for _, e in rec.events if e.get("type") == "reply.segment"}  # audio went out
        starts = [t for t, e in rec.events if e.get("type") == "reply.start" and e.get("trace_id") in heard]
        result.answered_once = judge.answered_once(starts, rec.said[-1].t_eot)
    rows_jsonl = _trace_rows(trace_dir, rec.call_id)
    marks = metrics.trace_marks(rec.events, rows_jsonl)
    rows = []
    for take in takes:
        if fault:
            take = dataclasses.replace(take, post=inject.HEARD_FAULTS[fault](take.post, take.rate))
        (run_dir / "post" / f"{case.id}_{take.reply_seq}.wav").write_bytes(wav_bytes(take.post, take.rate))
        rows.append(metrics.measure(take, case.priority, _pre(capture_dir, take.trace_id), marks.get(take.trace_id)))
    return result, rows


def _pre(capture_dir: Path | None, trace_id: str) -> tuple[Any, int] | None:
    path = capture_dir / f"{trace_id}.wav" if capture_dir else None
    return decode_wav(path.read_bytes()) if path is not None and path.is_file() else None


def _trace_rows(trace_dir: Path | None, call_id: str | None) -> list[dict[str, Any]]:
    path = trace_dir / f"{call_id}.jsonl" if trace_dir and call_id else None
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
