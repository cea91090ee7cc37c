"""Small statistics and options shared by the benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from voxgate.config import Settings
from voxgate.stats import percentile

# The qwen3 codec path `voxgate serve` runs unless VOXGATE_QWEN3_CODEC_LEAN says otherwise.
CODEC_LEAN_DEFAULT: bool = Settings.model_fields["qwen3_codec_lean"].default


def add_codec_lean_argument(parser: argparse.ArgumentParser) -> None:
    """`--codec-lean` / `--no-codec-lean`: which codec decoder path a qwen3 benchmark runs; by
    default the one the server runs by default, so a figure is of what users get."""
    parser.add_argument("--codec-lean", action=argparse.BooleanOptionalAction, default=CODEC_LEAN_DEFAULT,
                        help="the qwen3 codec decoder's lean path (default: as `voxgate serve` runs it, "
                        f"VOXGATE_QWEN3_CODEC_LEAN's default, {str(CODEC_LEAN_DEFAULT).lower()})")  # fmt: skip


def summary(values: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    return {
        "n": len(values),
        "p50": r(percentile(values, 50)),
        "p95": r(percentile(values, 95)),
        "p99": r(percentile(values, 99)),
        "min": r(min(values)) if values else None,
        "max": r(max(values)) if values else None,
    }


def machine() -> dict[str, str | int | None]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_report(report: dict[str, Any], name: str, stamp: datetime, output: str | None, table: str) -> Path:
    """Write a bench's JSON (to `output`, else bench/results/NAME-STAMP.json), print its table."""
    out = Path(output or f"bench/results/{name}-{stamp:%Y%m%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table)
    print(f"wrote {out}")
    return out
