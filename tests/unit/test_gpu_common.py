"""bench/gpu_common.sh's packing of a run's results (the device machine returns only a few files
from $OUT): each run of a call keeps its own archive, a TERM (a `timeout`) included."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("sh") is None or shutil.which("tar") is None, reason="needs sh and tar")


def _run(out: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = f'. bench/gpu_common.sh; mkdir -p "$RES"; {body}'
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out)}
    return subprocess.run(["sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def _archives(out: Path) -> dict[str, set[str]]:
    found = {}
    for path in sorted(out.glob("*.tgz")):
        with tarfile.open(path) as tar:
            found[path.name] = {Path(n).name for n in tar.getnames() if n not in (".", "./")}
    return found


def test_runs_of_one_call_each_keep_their_results_and_a_term_still_packs(tmp_path):
    assert _run(tmp_path, 'echo one > "$RES/first.txt"').returncode == 0
    assert _run(tmp_path, 'echo two > "$RES/second.txt"').returncode == 0
    term = _run(tmp_path, 'echo three > "$RES/third.txt"; kill -TERM $$; echo not reached > "$RES/after.txt"')
    assert term.returncode == 143
    assert _archives(tmp_path) == {
        "results-0.6B-CustomVoice.tgz": {"first.txt"},
        "results-0.6B-CustomVoice-2.tgz": {"second.txt"},
        "results-0.6B-CustomVoice-3.tgz": {"third.txt"},
    }
