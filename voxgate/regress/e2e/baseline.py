"""The e2e baseline: a passing run frozen as the reference of the PRIMARY KPI (and, for
reading side by side, its whole summary), as `regress freeze` does for tts.

A baseline is a folder (default `<output root>/golden/e2e/`): `baseline.json` (config and
its id, voxgate version, card, source run, the KPI's p95) and the run's `summary.json`. A
run under another config (tier, case set, how the server was run) refuses to compare with
it unless forced (`golden.BaselineMismatch`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voxgate.regress.golden import BaselineMismatch, config_diff
from voxgate.types import InvalidRequest, NotFound

BASELINE_FILE = "baseline.json"
KPI = "eot_to_first_audio_p95"


def config_id(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def baseline_dir(root: Path) -> Path:
    return root / "golden" / "e2e"


def load_baseline(path: Path, config: dict[str, Any], force: bool = False) -> dict[str, Any] | None:
    """baseline.json in `path` (None when there is none), with `forced` set when its config
    differs and `force` let it through."""
    meta_path = path / BASELINE_FILE
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    meta["forced"] = False
    if meta.get("config_id") != config_id(config):
        if not force:
            diff = "; ".join(config_diff(meta.get("config", {}), config)) or "unknown difference"
            raise BaselineMismatch(f"the e2e baseline in {path} was made with another config ({diff}); "
                                   "freeze a new one (`voxgate regress e2e --freeze`) or pass --force")  # fmt: skip
        meta["forced"] = True
    return meta


def freeze(run_dir: Path, dest: Path, force: bool = False) -> dict[str, Any]:
    """Make the run in `run_dir` the baseline in `dest` (replacing it); a failed run only
    with `force`. Returns the new baseline.json."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise NotFound(f"no e2e run in {run_dir} (summary.json missing)")
    summary = json.loads(summary_path.read_text())
    if summary.get("suite") != "e2e":
        raise InvalidRequest(f"{run_dir} is not an e2e run")
    if summary["verdict"] != "PASS" and not force:
        failed = ", ".join(g["name"] for g in summary["gates"] if g["status"] == "FAIL")
        raise InvalidRequest(f"run {run_dir} failed ({failed}); a failing run is not frozen unless --force")
    kpi = next((g["value"] for g in summary["gates"] if g["name"] == KPI), None)
    if kpi is None:
        raise InvalidRequest(f"run {run_dir} has no {KPI} to freeze")
    meta = {key: summary[key] for key in ("config", "config_id", "version", "card", "tier")}
    meta |= {"frozen_at": datetime.now(UTC).isoformat(timespec="seconds"), "source_run": str(run_dir.resolve()),
             "primary_kpi_p95_ms": kpi}  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(summary_path, dest / "summary.json")
    (dest / BASELINE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta
