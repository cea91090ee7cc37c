"""`voxgate regress tts`: one run from the engine to the verdict and the files.

Layout under the output root (default `regress/tts`, relative to the working directory):
`<stamp>_<engine>_<mode>/` per run (summary.json, summary_brief.json, report.md, figures,
audio/), `latest` -> the newest run, `history.log` (one line per run) and
`golden/<engine>/` (the baseline `voxgate regress freeze` makes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from voxgate import __version__
from voxgate.audio import wav_bytes
from voxgate.bench.stats import machine
from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.regress import plots, report
from voxgate.regress.gates import Gate, GateResult, evaluate, failed, load_gates, read_config, verdict
from voxgate.regress.golden import Golden, golden_dir, load_golden
from voxgate.regress.measure import CaseMetrics, CaseRecording, case_values, gate_metrics, measure_case
from voxgate.regress.texts import Mode, TextCase, load_texts
from voxgate.regress.tts import card, config_id, device, engine_config, record_all
from voxgate.types import InvalidRequest

DEFAULT_ROOT = Path("regress/tts")
MAX_FAILURE_FIGURES = 6


@dataclass(frozen=True, slots=True)
class TtsRun:
    """What a `regress tts` run is asked to do."""

    mode: Mode = "fast"
    root: Path = DEFAULT_ROOT
    golden: Path | None = None  # default: root/golden/<engine>
    force: bool = False  # compare with a baseline made under another config
    inject: str | None = None  # a fault from voxgate.regress.faults, applied to the streamed audio
    gates_file: Path | None = None  # default: the packaged gates.toml
    runs: int | None = None  # streamed runs per text (default: the mode's, from the gate config)
    texts: tuple[str, ...] | None = None  # only these text ids (default: the mode's set)
    record: bool = True  # append to history.log and move `latest`


def run_tts(
    options: TtsRun, settings: Settings, engine: Engine, progress: Callable[[str], None]
) -> tuple[dict[str, Any], list[GateResult]]:
    """Synthesise the text set, judge it, write the run folder; return (summary, gate results)."""
    started = time.perf_counter()
    config_file = read_config(options.gates_file)
    gates = load_gates(config_file, "tts", engine.name, device(settings, engine.name))
    runs = options.runs or int(config_file["tts"]["modes"][options.mode]["runs"])
    repeat_min_s = next(g.threshold for g in gates if g.name == "repeat")
    voice = settings.default_voice or engine.voices()[0].id
    config = engine_config(settings, engine, voice, load_texts("full"))
    cid = config_id(config)
    golden_path = options.golden or golden_dir(options.root, engine.name)
    golden = load_golden(golden_path, config, cid, options.force)
    progress(f"golden baseline: {golden_path if golden else 'none (SNR gates skipped)'}")

    recordings, skipped = record_all(engine, _texts(options), voice, runs, options.inject, progress)
    cases = [measure_case(r, golden.audio.get(r.case_id) if golden else None, repeat_min_s) for r in recordings]
    values, where = gate_metrics(cases)
    results = evaluate(values, gates, where)

    stamp = datetime.now(UTC)
    run_dir = _new_run_dir(options.root, f"{stamp:%Y%m%d-%H%M%S}_{engine.name}_{options.mode}")
    _write_audio(run_dir, recordings, offline=options.mode == "full")
    figures = _figures(run_dir, recordings, cases, results, gates)
    summary = {
        "suite": "tts",
        "verdict": verdict(results),
        "date": stamp.isoformat(timespec="seconds"),
        "engine": engine.name,
        "mode": options.mode,
        "runs": runs,
        "version": __version__,
        "config": config,
        "config_id": cid,
        "card": card(settings, engine.name),
        "machine": machine(),  # cores and load average: what the TTFA numbers were measured under
        "golden": _golden_info(golden),
        "inject": options.inject,
        "gates": [asdict(r) for r in results],
        "cases": [
            {**asdict(c), "failed": f} for c, f in zip(cases, _failing_by_case(cases, gates).values(), strict=True)
        ],
        "skipped": skipped,
        "wall_s": round(time.perf_counter() - started, 2),
        "run_dir": str(run_dir),
    }
    report.write_json(run_dir / "summary.json", summary)
    report.write_json(run_dir / "summary_brief.json", report.brief(summary))
    (run_dir / "report.md").write_text(report.markdown(summary, results, figures), encoding="utf-8")
    if options.record:
        report.append_history(options.root, report.history_line(summary))
        report.update_latest(options.root, run_dir)
    return summary, results


def _texts(options: TtsRun) -> list[TextCase]:
    cases = load_texts(options.mode)
    if options.texts is None:
        return cases
    known = {c.id for c in load_texts("full")}
    unknown = sorted(set(options.texts) - known)
    if unknown:
        raise InvalidRequest(f"unknown text ids: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [c for c in load_texts("full") if c.id in options.texts]


def _new_run_dir(root: Path, name: str) -> Path:
    path, n = root / name, 1
    while path.exists():  # two runs in one second
        n += 1
        path = root / f"{name}-{n}"
    (path / "audio").mkdir(parents=True)
    return path


def _write_audio(run_dir: Path, recordings: list[CaseRecording], offline: bool) -> None:
    """The first streamed run of each text (what a baseline freezes); offline too in full mode."""
    for rec in recordings:
        if rec.runs:
            audio = np.nan_to_num(rec.runs[0])
            (run_dir / "audio" / f"{rec.case_id}.wav").write_bytes(wav_bytes(audio, rec.sample_rate))
        if offline and rec.offline is not None:
            data = wav_bytes(np.nan_to_num(rec.offline), rec.sample_rate)
            (run_dir / "audio" / f"{rec.case_id}.offline.wav").write_bytes(data)


def _failing_by_case(cases: list[CaseMetrics], gates: list[Gate]) -> dict[str, list[str]]:
    """The per-text gates each text fails on its own."""
    return {c.case_id: failed(evaluate(case_values(c), gates)) for c in cases}


def _figures(
    run_dir: Path,
    recordings: list[CaseRecording],
    cases: list[CaseMetrics],
    results: list[GateResult],
    gates: list[Gate],
) -> dict[str, str]:
    """The latency CDF, and waveform + spectrogram of each text a failing gate names."""
    ttfa_gate = next((r for r in results if r.name == "ttfa_p95"), None)
    ttfa = [t for c in cases for t in c.ttfa_ms]
    figures = {"Time to first audio (CDF)": plots.latency_cdf(ttfa, ttfa_gate and ttfa_gate.threshold,
                                                              run_dir / "ttfa_cdf.png").name}  # fmt: skip
    by_id = {r.case_id: r for r in recordings}
    metrics = {c.case_id: c for c in cases}
    failing = {cid: names for cid, names in _failing_by_case(cases, gates).items() if names and by_id[cid].runs}
    for case_id, names in list(failing.items())[:MAX_FAILURE_FIGURES]:
        m = metrics[case_id]
        marks = [(m.pop_click_at_s, "click")] if m.pop_click_at_s is not None and "pop_click" in names else []
        if m.repeat_at_s and "repeat" in names:
            marks += [(m.repeat_at_s[0], "repeat from"), (m.repeat_at_s[1], "again")]
        path = run_dir / f"fail_{case_id}.png"
        plots.waveform_spectrogram(by_id[case_id].runs[0], by_id[case_id].sample_rate,
                                   f"{case_id}: {', '.join(names)}", path, marks)  # fmt: skip
        figures[f"{case_id} ({', '.join(names)})"] = path.name
    return figures


def _golden_info(golden: Golden | None) -> dict[str, Any] | None:
    if golden is None:
        return None
    keys = ("frozen_at", "version", "card", "config_id", "mode", "source_run")
    return {"path": str(golden.path), "forced": golden.forced, **{k: golden.meta.get(k) for k in keys},
            "texts_with_audio": sorted(golden.audio)}  # fmt: skip
