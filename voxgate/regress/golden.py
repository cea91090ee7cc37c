"""Golden baselines: a passing run frozen as the reference later runs are compared with.

A baseline is a folder: `golden.json` (config, config id, voxgate version, card, source run,
per-text PCM hash and duration), the run's `summary.json`, and one `<text id>.wav` per text.
By default it lives in `<output root>/golden/<engine>/`. A run made under a different config
(engine settings, voice, seed or text set, see `voxgate.regress.tts.engine_config`) refuses
to compare with it unless forced: its numbers would measure the config change, not a
regression. A different card or version is only reported.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from voxgate.audio import decode_wav
from voxgate.types import InvalidRequest, NotFound, VoxgateError

GOLDEN_FILE = "golden.json"


class BaselineMismatch(VoxgateError):
    """The golden baseline was made with another config."""

    code = "baseline_mismatch"
    status = 409


@dataclass(frozen=True, slots=True)
class Golden:
    path: Path
    meta: dict[str, Any]
    audio: dict[str, np.ndarray]
    forced: bool = False  # compared although its config differs


def golden_dir(root: Path, engine: str) -> Path:
    return root / "golden" / engine


def config_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for every (nested) key whose value differs."""
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += config_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return lines


def load_golden(path: Path, config: dict[str, Any], config_id: str, force: bool = False) -> Golden | None:
    """The baseline in `path` (None when there is none), checked against this run's config."""
    meta_path = path / GOLDEN_FILE
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text())
    forced = False
    if meta.get("config_id") != config_id:
        diff = "; ".join(config_diff(meta.get("config", {}), config)) or "unknown difference"
        if not force:
            raise BaselineMismatch(
                f"the golden baseline in {path} was made with another config ({diff}); "
                "freeze a new one with `voxgate regress freeze`, or pass --force to compare anyway"
            )
        forced = True
    audio = {}
    for case_id in meta.get("cases", {}):
        wav = path / f"{case_id}.wav"
        if wav.is_file():
            audio[case_id] = decode_wav(wav.read_bytes())[0]
    return Golden(path, meta, audio, forced)


def freeze(run_dir: Path, dest: Path, force: bool = False) -> dict[str, Any]:
    """Make the run in `run_dir` the baseline in `dest` (replacing the old one whole).
    A run that failed a gate is refused unless `force`. Returns the new golden.json."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise NotFound(f"no regression run in {run_dir} (summary.json missing)")
    summary = json.loads(summary_path.read_text())
    if summary.get("verdict") != "PASS" and not force:
        failed = ", ".join(g["name"] for g in summary.get("gates", []) if g["status"] == "FAIL")
        raise InvalidRequest(f"run {run_dir} failed ({failed}); a failing run is not frozen unless --force")
    cases = {c["case_id"]: c for c in summary.get("cases", []) if not c["problems"]}
    missing = [cid for cid in cases if not (run_dir / "audio" / f"{cid}.wav").is_file()]
    if missing or not cases:
        raise InvalidRequest(f"run {run_dir} has no audio to freeze for: {', '.join(missing) or 'any text'}")
    meta = {
        "suite": summary["suite"],
        "engine": summary["engine"],
        "config": summary["config"],
        "config_id": summary["config_id"],
        "version": summary["version"],
        "card": summary["card"],
        "mode": summary["mode"],
        "frozen_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source_run": str(run_dir.resolve()),
        "ttfa_p95_ms": next((g["value"] for g in summary["gates"] if g["name"] == "ttfa_p95"), None),
        "cases": {cid: {"pcm_hash": c["hashes"][0], "duration_s": c["duration_s"]} for cid, c in cases.items()},
    }
    staging = dest.with_name(dest.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for cid in cases:
        shutil.copyfile(run_dir / "audio" / f"{cid}.wav", staging / f"{cid}.wav")
    shutil.copyfile(summary_path, staging / "summary.json")
    (staging / GOLDEN_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return meta
