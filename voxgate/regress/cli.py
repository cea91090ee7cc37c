"""The `voxgate regress ...` commands: tts, freeze, stability (e2e adds itself beside them).

Exit codes: 0 PASS, 1 FAIL (a gate failed), 2 an error (bad arguments, baseline mismatch).
Progress goes to stderr, the verdict and the report's path to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from voxgate.regress.faults import FAULTS
from voxgate.regress.run import DEFAULT_ROOT


def add_regress_commands(sub: argparse._SubParsersAction) -> None:
    """Add tts, freeze and stability to the `regress` group's subparsers."""
    tts = sub.add_parser("tts", help="TTS regression: the text set through an engine, gates, report, history")
    _engine_arguments(tts)
    tts.add_argument("--mode", choices=["fast", "full"], default="fast",
                     help="fast: 4 texts x 3 runs; full: 9 texts x 5 runs + offline WAVs")  # fmt: skip
    tts.add_argument("--golden", type=Path, help="baseline folder (default OUT/golden/ENGINE)")
    tts.add_argument("--force", action="store_true", help="compare with a baseline made under another config")
    tts.add_argument("--inject", choices=sorted(FAULTS), help="corrupt the streamed audio on purpose (self-test)")
    tts.add_argument("--runs", type=int, help="streamed runs per text (default: the mode's, from the gate config)")
    tts.add_argument("--texts", help="only these text ids, comma-separated (e.g. en_short_01 for a slow engine)")
    tts.set_defaults(func=cmd_tts)

    freeze = sub.add_parser("freeze", help="make a passing tts run the golden baseline")
    freeze.add_argument("--run", type=Path, help="run folder (default OUT/latest)")
    freeze.add_argument("--out", type=Path, default=DEFAULT_ROOT, help=f"output root (default {DEFAULT_ROOT})")
    freeze.add_argument("--golden", type=Path, help="baseline folder to write (default OUT/golden/ENGINE)")
    freeze.add_argument("--force", action="store_true", help="freeze a run that failed a gate")
    freeze.set_defaults(func=cmd_freeze)

    stability = sub.add_parser("stability", help="repeat the tts run: median, p95, sigma per gate, thresholds")
    _engine_arguments(stability)
    stability.add_argument("--runs", type=int, default=5, help="tts runs (default 5)")
    stability.add_argument("--mode", choices=["fast", "full"], default="fast")
    stability.set_defaults(func=cmd_stability)


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", help="tone | piper | qwen3 (default VOXGATE_ENGINE, else piper)")
    parser.add_argument("--checkpoint", type=Path, help="qwen3: checkpoint directory (VOXGATE_QWEN3_MODEL_DIR)")
    parser.add_argument("--out", type=Path, default=DEFAULT_ROOT, help=f"output root (default {DEFAULT_ROOT})")
    parser.add_argument("--gates", type=Path, help="threshold file (default: the packaged gates.toml)")


def _progress(line: str) -> None:
    print(f"regress: {line}", file=sys.stderr, flush=True)


def _engine(args: argparse.Namespace):  # -> (Settings, Engine)
    import time

    from voxgate.config import Settings
    from voxgate.engines.registry import create_engine, engine_names
    from voxgate.types import UnknownEngine

    overrides = {"engine": args.engine, "qwen3_model_dir": args.checkpoint}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    if settings.engine not in engine_names():
        raise UnknownEngine(f"no engine named {settings.engine!r}; available: {', '.join(engine_names())}")
    started = time.perf_counter()
    engine = create_engine(settings.engine, settings)
    engine.warmup()
    _progress(f"engine {engine.name} ready in {time.perf_counter() - started:.1f} s")
    return settings, engine


def cmd_tts(args: argparse.Namespace) -> int:
    from voxgate.regress.run import TtsRun, run_tts

    settings, engine = _engine(args)
    texts = tuple(t.strip() for t in args.texts.split(",") if t.strip()) if args.texts else None
    options = TtsRun(mode=args.mode, root=args.out, golden=args.golden, force=args.force, inject=args.inject,
                     gates_file=args.gates, runs=args.runs, texts=texts)  # fmt: skip
    try:
        summary, results = run_tts(options, settings, engine, _progress)
    finally:
        engine.close()
    for r in results:
        _progress(f"{r.status:4} {r.name}: {r.value if r.value is None else round(r.value, 4)} "
                  f"({r.op} {r.threshold:g} {r.unit}){'  <- ' + r.where if r.status == 'FAIL' else ''}")  # fmt: skip
    print(f"{summary['verdict']} regress tts ({summary['engine']}, {summary['mode']}) in {summary['wall_s']} s: "
          f"{summary['run_dir']}/report.md")  # fmt: skip
    return 0 if summary["verdict"] == "PASS" else 1


def cmd_freeze(args: argparse.Namespace) -> int:
    from voxgate.regress.golden import freeze, golden_dir
    from voxgate.types import NotFound

    run = args.run or args.out / "latest"
    if not (run / "summary.json").is_file():
        raise NotFound(f"no regression run in {run}; run `voxgate regress tts` first or pass --run DIR")
    engine = json.loads((run / "summary.json").read_text())["engine"]
    dest = args.golden or golden_dir(args.out, engine)
    meta = freeze(run.resolve(), dest, args.force)
    print(f"froze {meta['source_run']} as the {engine} golden baseline in {dest} "
          f"({len(meta['cases'])} texts, config {meta['config_id']}, card {meta['card']})")  # fmt: skip
    return 0


def cmd_stability(args: argparse.Namespace) -> int:
    from voxgate.regress import report, stability
    from voxgate.regress.gates import load_gates, read_config
    from voxgate.regress.golden import golden_dir
    from voxgate.regress.run import TtsRun, run_tts
    from voxgate.regress.tts import device
    from voxgate.types import InvalidRequest

    if args.runs < 2:
        raise InvalidRequest(f"--runs must be at least 2, got {args.runs}")
    settings, engine = _engine(args)
    root = args.out / "stability" / f"{datetime.now(UTC):%Y%m%d-%H%M%S}_{engine.name}_{args.mode}"
    root.mkdir(parents=True)
    summaries = []
    try:
        for i in range(args.runs):
            _progress(f"stability run {i + 1}/{args.runs}")
            options = TtsRun(mode=args.mode, root=root, golden=golden_dir(args.out, engine.name),
                             gates_file=args.gates, record=False, force=True)  # fmt: skip
            summaries.append(run_tts(options, settings, engine, _progress)[0])
    finally:
        engine.close()
    gates = load_gates(read_config(args.gates), "tts", engine.name, device(settings, engine.name))
    rows, text = stability.table(gates, summaries)
    result = {"engine": engine.name, "mode": args.mode, "runs": args.runs, "gates": rows,
              "run_dirs": [s["run_dir"] for s in summaries]}  # fmt: skip
    report.write_stability(root, f"regress stability: {engine.name}, {args.mode} x {args.runs}", text, result)
    return 0
