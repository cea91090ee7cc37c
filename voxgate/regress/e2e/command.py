"""`voxgate regress e2e | e2e-freeze | e2e-stability`, added to the `regress` group.

Exit codes as for `regress tts`: 0 PASS, 1 FAIL (a gate failed), 2 an error.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from voxgate.regress.e2e.cases import TIERS
from voxgate.regress.e2e.inject import HEARD_FAULTS
from voxgate.regress.e2e.runner import DEFAULT_ROOT


def add_e2e_commands(sub: argparse._SubParsersAction) -> None:
    e2e = sub.add_parser("e2e", help="end-to-end voice calls with a bot: three rings of metrics, gates, report")
    _run_arguments(e2e)
    e2e.add_argument("--freeze", action="store_true", help="make this run the baseline (if it passes, or --force)")
    e2e.add_argument("--inject", choices=sorted(HEARD_FAULTS), help="corrupt every reply as heard (self-test)")
    e2e.set_defaults(func=cmd_e2e)

    freeze = sub.add_parser("e2e-freeze", help="make a passing e2e run the baseline of the PRIMARY KPI")
    freeze.add_argument("--run", type=Path, help="run folder (default OUT/latest)")
    freeze.add_argument("--out", type=Path, default=DEFAULT_ROOT, help=f"output root (default {DEFAULT_ROOT})")
    freeze.add_argument("--baseline", type=Path, help="baseline folder (default OUT/golden/e2e)")
    freeze.add_argument("--force", action="store_true", help="freeze a run that failed a gate")
    freeze.set_defaults(func=cmd_e2e_freeze)

    stability = sub.add_parser("e2e-stability", help="repeat the e2e run: median, p95, sigma per gate, thresholds")
    _run_arguments(stability)
    stability.add_argument("--runs", type=int, default=5, help="e2e runs (default 5)")
    stability.set_defaults(func=cmd_e2e_stability)


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tier", choices=TIERS, default="mini", help="mini (4 P0 cases), fast (all), nightly")
    parser.add_argument("--turns", type=int, default=20, help="nightly: fresh calls (default 20)")
    parser.add_argument("--case", action="append", dest="only", default=[], help="run only this case id (repeatable)")
    parser.add_argument("--cases", type=Path, help="case file (default: the packaged cases.json)")
    parser.add_argument("--url", help="a running voxgate server (default: start one with the CPU defaults)")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a VOXGATE_ setting (without the prefix) for the spawned server, e.g. AGENT_MAX_TOKENS=60",
    )
    parser.add_argument("--capture-dir", type=Path, help="with --url: the server's VOXGATE_AGENT_CAPTURE_DIR")
    parser.add_argument("--trace-dir", type=Path, help="with --url: the server's VOXGATE_AGENT_TRACE_DIR")
    parser.add_argument("--out", type=Path, default=DEFAULT_ROOT, help=f"output root (default {DEFAULT_ROOT})")
    parser.add_argument("--gates", type=Path, help="threshold file (default: the packaged e2e gates.toml)")
    parser.add_argument("--baseline", type=Path, help="baseline folder (default OUT/golden/e2e)")
    parser.add_argument("--force", action="store_true", help="compare with (or freeze) despite a config mismatch")
    parser.add_argument("--no-retry", action="store_true", help="do not call again after a silent capture")


def _progress(line: str) -> None:
    print(f"regress e2e: {line}", file=sys.stderr, flush=True)


def _options(args: argparse.Namespace):  # -> E2eRun
    from voxgate.regress.e2e.runner import E2eRun
    from voxgate.types import InvalidRequest

    if any("=" not in item for item in args.server_env):
        raise InvalidRequest("--server-env takes NAME=VALUE")
    env = tuple(tuple(item.split("=", 1)) for item in args.server_env)
    return E2eRun(tier=args.tier, turns=args.turns, only=tuple(args.only), url=args.url, capture_dir=args.capture_dir,
                  server_env=env,  # type: ignore[arg-type]
                  trace_dir=args.trace_dir, root=args.out, cases_file=args.cases, gates_file=args.gates,
                  baseline=args.baseline, force=args.force, retry=not args.no_retry)  # fmt: skip


def cmd_e2e(args: argparse.Namespace) -> int:
    from voxgate.regress.e2e import baseline
    from voxgate.regress.e2e.runner import run_e2e

    summary, results = run_e2e(replace(_options(args), inject=args.inject), _progress)
    for r in results:
        mark = f"  <- {r.where}" if r.status in ("FAIL", "WARN") and r.where else ""
        _progress(f"{r.status:4} {r.name}: {r.value} ({r.op} {r.threshold:g} {r.unit}){mark}")
    where = f"{summary['run_dir']}/report.md"
    print(f"{summary['verdict']} regress e2e ({summary['tier']}) in {summary['wall_s']} s: {where}")
    if args.freeze:
        dest = args.baseline or baseline.baseline_dir(args.out)
        meta = baseline.freeze(Path(summary["run_dir"]), dest, args.force)
        print(f"froze it as the e2e baseline in {dest} (EoT -> first audio p95 {meta['primary_kpi_p95_ms']} ms)")
    return 0 if summary["verdict"] == "PASS" else 1


def cmd_e2e_freeze(args: argparse.Namespace) -> int:
    from voxgate.regress.e2e import baseline

    run = args.run or args.out / "latest"
    dest = args.baseline or baseline.baseline_dir(args.out)
    meta = baseline.freeze(run.resolve(), dest, args.force)
    print(f"froze {meta['source_run']} as the e2e baseline in {dest} "
          f"(EoT -> first audio p95 {meta['primary_kpi_p95_ms']} ms, config {meta['config_id']})")  # fmt: skip
    return 0


def cmd_e2e_stability(args: argparse.Namespace) -> int:
    from voxgate.regress.e2e import stability
    from voxgate.regress.e2e.runner import GATES_FILE, run_e2e
    from voxgate.regress.gates import read_config
    from voxgate.regress.report import write_stability
    from voxgate.types import InvalidRequest

    if args.runs < 2:
        raise InvalidRequest(f"--runs must be at least 2, got {args.runs}")
    root = args.out / "stability" / f"{datetime.now(UTC):%Y%m%d-%H%M%S}_{args.tier}"
    summaries = []
    for i in range(args.runs):
        _progress(f"stability run {i + 1}/{args.runs}")
        summaries.append(run_e2e(replace(_options(args), root=root, record=False, force=True), _progress)[0])
    rows, text = stability.table(read_config(args.gates or GATES_FILE), summaries)
    result = {"tier": args.tier, "runs": args.runs, "gates": rows, "run_dirs": [s["run_dir"] for s in summaries]}
    write_stability(root, f"regress e2e stability: {args.tier} x {args.runs}", text, result)
    print(json.dumps({"verdicts": [s["verdict"] for s in summaries]}))
    return 0
