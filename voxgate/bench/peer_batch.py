"""The batched open peer, faster-qwen3-tts-batch 0.2.0, beside our concurrency rows.

It runs only on its own stack (transformers 4.57.3, qwen-tts 0.1.1, faster-qwen3-tts 0.5.4 with a
one-line shim), which cannot share a process with ours, so `voxgate bench tts --peer
faster-qwen3-tts-batch` runs it in a subprocess (`peer_batch_child.py`) whose PYTHONPATH is that
stack's `pip install --target` dir (`--peer-site`; bench/gpu_bundle_peer.sh, bench/gpu_peer.sh),
then the repository (for the child module alone). Same checkpoint, text, speaker and frame count
as our rows, one row per stream count. The peer is offline: a stream's first audio is its whole
audio, after the batch's generation and the decodes before its own.

Per stream count, over the timed batches (the same keys as ours): ttfa_ms_p50 / p95 over every
stream, worst_rtf (a stream's first audio / its audio length: offline, it has nothing earlier),
audio_s_per_s (all streams' audio / the batch's wall time, median over batches), peak_gpu_gib.
Ratios: throughput ours / peer, first audio peer / ours (> 1: voxgate is better in both).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import voxgate
from voxgate.bench.stats import percentile

PEER_BATCH = "faster-qwen3-tts-batch"
CHILD = "voxgate.bench.peer_batch_child"
DEFAULT_SITE = "/tmp/peer-site"  # where bench/gpu_peer.sh installs the peer's stack on the device
BUNDLE_HINT = (
    "build its stack with bench/gpu_bundle_peer.sh, then on the GPU machine: python3 -m pip install "
    "--no-index --no-deps --target /tmp/peer-site .gpu-peer/peer/*.whl (bench/gpu_peer.sh does both)"
)


class PeerUnavailable(RuntimeError):
    """The batched peer cannot run here (no CUDA, its stack missing, its load failed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{PEER_BATCH}: {message}")
        self.code = code


def child_command(
    python: str, model_dir: str, text: str, speaker: str | None, language: str, frames: int,
    streams: list[int], runs: int, device: str, dtype: str, output: Path,
) -> list[str]:  # fmt: skip
    """The child's command line (`peer_batch_child.parse` reads it back)."""
    command = [python, "-m", CHILD, "--model-dir", model_dir, "--text", text, "--language", language,
               "--frames", str(frames), "--batch-sizes", ",".join(str(n) for n in streams), "--runs", str(runs),
               "--device", device, "--dtype", dtype, "--max-seq-len", str(max_seq_len(frames)),
               "--output-json", str(output)]  # fmt: skip
    return command + (["--speaker", speaker] if speaker else [])


def max_seq_len(frames: int) -> int:
    """The peer's static KV cache length: the prompt (under 256 positions for the bench's text)
    plus the frames, rounded up to 256 (a row at 64 streams is 64 x this, kept small)."""
    return max(512, -(-(frames + 256) // 256) * 256)


def child_env(site: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the peer's site dir first, then the repository (for the child
    module); our own PYTHONPATH is dropped; offline."""
    env = dict(os.environ if base is None else base)
    repo = str(Path(voxgate.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([site, repo])
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


def run_batch_peer(
    model_dir: str, text: str, speaker: str | None, language: str, frames: int, streams: list[int], runs: int,
    device: str, dtype: str, site: str = DEFAULT_SITE, python: str = sys.executable, timeout_s: float = 3600,
) -> dict[str, Any]:  # fmt: skip
    """Run the peer in its own process on `streams` (a row each) and summarise its report."""
    if not device.startswith("cuda"):
        raise PeerUnavailable("cuda_only", f"runs on CUDA only (its steps are CUDA graphs); got --device {device}")
    if not streams or min(streams) < 1 or frames < 1 or runs < 1:
        raise ValueError("the batched peer needs stream counts (--concurrency), frames and runs >= 1")
    if not Path(site, "faster_qwen3_tts_batch").is_dir():
        raise PeerUnavailable("peer_missing", f"no faster_qwen3_tts_batch in --peer-site {site}; {BUNDLE_HINT}")
    with tempfile.TemporaryDirectory(prefix="peer-batch-") as tmp:
        out = Path(tmp) / "peer.json"
        command = child_command(python, model_dir, text, speaker, language, frames, streams, runs, device, dtype, out)
        try:
            done = subprocess.run(command, env=child_env(site), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise PeerUnavailable("timeout", f"no report after {timeout_s:.0f} s") from e
        report = read_report(out, done.returncode, done.stderr)
    return summarise(report, frames)


def read_report(path: Path, returncode: int, stderr: str) -> dict[str, Any]:
    """The child's JSON; its error (or a crash with no JSON) as PeerUnavailable."""
    tail = "\n".join(stderr.strip().splitlines()[-12:])
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PeerUnavailable("crashed", f"exit {returncode} with no report ({e}); its stderr ends:\n{tail}") from e
    if "error" in report:
        error = report["error"]
        hint = f"; {BUNDLE_HINT}" if error.get("code") == "peer_missing" else ""
        raise PeerUnavailable(error.get("code", "failed"), f"{error.get('message')}{hint}")
    return report


def summarise(report: dict[str, Any], frames: int) -> dict[str, Any]:
    """The child's report with each batch size's runs made one row (see the module docstring)."""
    rows = [_row(batch, frames) for batch in report["batches"]]
    keep = ("peer", "versions", "model_type", "speaker", "load_s", "gpu")
    return {**{k: report[k] for k in keep if k in report}, "frames": frames, "concurrency": rows}


def _row(batch: dict[str, Any], frames: int) -> dict[str, Any]:
    n = batch["streams"]
    if "error" in batch:
        return {"streams": n, "errors": [batch["error"]]}
    streams = [s for run in batch["runs"] for s in run["streams"]]
    ttfa = [1000 * s["ttfa_s"] for s in streams if s["ttfa_s"] is not None]
    errors = [f"a stream produced {s['frames']} frames, not {frames}" for s in streams if s["frames"] != frames]
    rates = [sum(s["audio_s"] for s in run["streams"]) / run["wall_s"] for run in batch["runs"]]
    worst = [s["ttfa_s"] / s["audio_s"] for s in streams if s["ttfa_s"] is not None and s["audio_s"] > 0]
    return {
        "streams": n,
        "errors": errors,
        "ttfa_ms_p50": round(statistics.median(ttfa), 1) if ttfa else None,
        "ttfa_ms_p95": round(percentile(ttfa, 95), 1) if ttfa else None,
        "worst_rtf": round(max(worst), 4) if worst else None,
        "audio_s_per_s": round(statistics.median(rates), 1) if rates else None,
        "peak_gpu_gib": batch.get("peak_gpu_gib"),
        "runs": len(batch["runs"]),
        "warmup_s": batch.get("warmup_s"),
    }


def ratios(ours: list[dict[str, Any]], peer: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per stream count in both: throughput ours / peer, first audio p50 and p95 peer / ours."""
    theirs = {row["streams"]: row for row in peer}
    out = {}
    for row in ours:
        other = theirs.get(row["streams"])
        if other is None:
            continue
        out[str(row["streams"])] = {
            "audio_s_per_s": _over(row.get("audio_s_per_s"), other.get("audio_s_per_s")),
            "ttfa_p50": _over(other.get("ttfa_ms_p50"), row.get("ttfa_ms_p50")),
            "ttfa_p95": _over(other.get("ttfa_ms_p95"), row.get("ttfa_ms_p95")),
        }
    return out


def _over(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 2) if numerator and denominator else None
