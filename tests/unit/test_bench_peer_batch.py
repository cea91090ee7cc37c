"""`voxgate bench tts --peer faster-qwen3-tts-batch` on the CPU: the peer itself needs CUDA and its
own stack, so what runs here is the real child process up to where it stops (its refusal, its
import failure, told back through the report file), the command line and environment it gets,
and the rows and ratios made from a report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voxgate.bench import peer_batch, peer_batch_child
from voxgate.bench.peer_batch import PeerUnavailable, child_command, child_env, ratios, read_report, summarise
from voxgate.bench.tts import table
from voxgate.cli import main


def _stream(ttfa_s: float, frames: int = 40) -> dict:
    return {"ttfa_s": ttfa_s, "audio_s": frames * 0.08, "frames": frames}


def _report() -> dict:
    """A child's report: 2 streams x 2 timed batches, then 4 streams that failed."""
    runs = [{"wall_s": 2.0, "streams": [_stream(1.0), _stream(2.0)]},
            {"wall_s": 4.0, "streams": [_stream(3.0), _stream(4.0, frames=39)]}]  # fmt: skip
    return {"peer": "faster-qwen3-tts-batch", "versions": {"transformers": "4.57.3"}, "model_type": "custom_voice",
            "speaker": "aiden", "load_s": 9.5, "gpu": "H100",
            "batches": [{"streams": 2, "peak_gpu_gib": 5.5, "warmup_s": 30.0, "runs": runs},
                        {"streams": 4, "error": "OutOfMemoryError: CUDA out of memory"}]}  # fmt: skip


def test_a_cpu_device_is_refused_before_any_process_starts(tmp_path):
    with pytest.raises(PeerUnavailable, match="CUDA only") as refused:
        peer_batch.run_batch_peer("/x/cv06", "Hi.", None, "english", 5, [4], 1, "cpu", "float32", site=str(tmp_path))
    assert refused.value.code == "cuda_only"


def test_the_bench_refuses_the_batched_peer_without_cuda_or_stream_counts(capsys):
    """It says so and exits 2 before loading anything (the model directory does not exist)."""
    for extra in (["--device", "cpu", "--concurrency", "4"], ["--device", "cuda"]):
        argv = ["bench", "tts", "--model-dir", "/does/not/exist", "--peer", "faster-qwen3-tts-batch", *extra]
        assert main(argv) == 2
        assert "needs --concurrency and --device cuda" in capsys.readouterr().out


def test_a_site_without_the_peer_names_the_bundle_to_build(tmp_path):
    with pytest.raises(PeerUnavailable, match=r"gpu_bundle_peer\.sh") as missing:
        peer_batch.run_batch_peer("/x/cv06", "Hi.", None, "english", 5, [4], 1, "cuda", "bfloat16", site=str(tmp_path))
    assert missing.value.code == "peer_missing"


def test_the_child_reports_a_cpu_device_in_its_file_and_exit_status(tmp_path):
    out = tmp_path / "peer.json"
    command = child_command(sys.executable, "/x/cv06", "Hi.", None, "english", 5, [1, 4], 1, "cpu", "float32", out)
    done = subprocess.run(command, env=child_env(str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert json.loads(out.read_text())["error"]["code"] == "cuda_only"


def test_the_childs_import_failure_comes_back_as_peer_missing(tmp_path):
    """A real round trip: the child starts on a site dir whose peer package is empty, fails to
    import the peer's stack, writes its error; the parent raises it with the bundle to build."""
    (tmp_path / "faster_qwen3_tts_batch").mkdir()
    with pytest.raises(PeerUnavailable, match=r"faster_qwen3_tts.*gpu_bundle_peer\.sh") as missing:
        peer_batch.run_batch_peer("/x/cv06", "Hi.", None, "english", 5, [2], 1, "cuda", "bfloat16",
                                  site=str(tmp_path), timeout_s=300)  # fmt: skip
    assert missing.value.code == "peer_missing"


def test_a_crash_without_a_report_shows_the_end_of_its_stderr(tmp_path):
    with pytest.raises(PeerUnavailable, match=r"exit 139 with no report(.|\n)*Segmentation fault") as crashed:
        read_report(tmp_path / "absent.json", 139, "loading\nFatal Python error: Segmentation fault\n")
    assert crashed.value.code == "crashed"


def test_the_command_line_reads_back_as_it_was_meant():
    command = child_command("python3", "/ck", "Hello there.", "ryan", "english", 120, [1, 16, 64], 3, "cuda:1",
                            "bfloat16", Path("/tmp/o.json"))  # fmt: skip
    assert command[:3] == ["python3", "-m", "voxgate.bench.peer_batch_child"]
    args = peer_batch_child.parse(command[3:])
    assert (args.model_dir, args.text, args.speaker, args.frames, args.runs) == ("/ck", "Hello there.", "ryan", 120, 3)
    assert args.batch_sizes == [1, 16, 64] and args.device == "cuda:1" and args.output_json == "/tmp/o.json"
    assert args.max_seq_len >= 120 + 256  # the prompt and every frame fit the peer's static cache
    assert peer_batch_child.parse(child_command("p", "/ck", "t", None, "english", 5, [1], 1, "cuda", "bfloat16",
                                                Path("o"))[3:]).speaker is None  # fmt: skip


def test_the_child_sees_the_peer_site_first_and_not_our_path(tmp_path):
    env = child_env("/tmp/peer-site", {"PYTHONPATH": "/our/venv/lib", "HOME": "/root"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == "/tmp/peer-site" and "/our/venv/lib" not in parts
    assert Path(parts[1], "voxgate", "bench", "peer_batch_child.py").is_file()
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1" and env["HOME"] == "/root"


def test_rows_from_a_report():
    result = summarise(_report(), frames=40)
    assert result["speaker"] == "aiden" and result["versions"] == {"transformers": "4.57.3"} and result["frames"] == 40
    two, four = result["concurrency"]
    assert two["streams"] == 2 and two["runs"] == 2 and two["peak_gpu_gib"] == 5.5
    assert two["ttfa_ms_p50"] == 2500.0 and 3000.0 < two["ttfa_ms_p95"] <= 4000.0  # over all 4 streams
    assert two["worst_rtf"] == pytest.approx(4.0 / (39 * 0.08), abs=1e-4)  # the latest audio per its length
    assert two["audio_s_per_s"] == pytest.approx(((6.4 / 2.0) + (6.32 / 4.0)) / 2, abs=0.05)  # median over batches
    assert two["errors"] == ["a stream produced 39 frames, not 40"]
    assert four == {"streams": 4, "errors": ["OutOfMemoryError: CUDA out of memory"]}


def test_ratios_and_table_put_the_peer_beside_our_rows():
    peer = summarise(_report(), frames=40)
    ours = [{"streams": 1, "ttfa_ms_p50": 10.0, "ttfa_ms_p95": 12.0, "worst_rtf": 0.05, "audio_s_per_s": 20.0,
             "errors": []},
            {"streams": 2, "ttfa_ms_p50": 25.0, "ttfa_ms_p95": 40.0, "worst_rtf": 0.06, "audio_s_per_s": 48.0,
             "errors": []}]  # fmt: skip
    got = ratios(ours, peer["concurrency"])
    assert list(got) == ["2"]  # only the stream counts both measured
    assert got["2"]["audio_s_per_s"] == round(48.0 / peer["concurrency"][0]["audio_s_per_s"], 2)
    assert got["2"]["ttfa_p50"] == 100.0  # 2500 ms / 25 ms: > 1 means voxgate is first
    lines = table({"packets": {}, "concurrency": ours, "peer": peer}).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| 2 |"))
    assert lines[at + 1].startswith("| 2 (peer) | 2500.0 |")
    assert not any(line.startswith("| 1 (peer)") for line in lines)


def test_a_peer_that_cannot_run_is_recorded_and_our_rows_kept(tmp_path, capsys):
    from argparse import Namespace

    from voxgate.bench import tts

    ours = [{"streams": 4, "ttfa_ms_p50": 20.0, "ttfa_ms_p95": 22.0, "worst_rtf": 0.1, "audio_s_per_s": 30.0,
             "errors": []}]  # fmt: skip
    result = {"packets": {}, "concurrency": ours}
    args = Namespace(model_dir="/x/cv06", frames=5, runs=1, device="cuda", dtype="bfloat16", peer_site=str(tmp_path))
    tts._batched_peer(args, result, "aiden", [4])
    assert result["concurrency"] == ours and "ratios" not in result
    assert result["peer"]["error"]["code"] == "peer_missing" and "gpu_bundle_peer.sh" in capsys.readouterr().out
    assert "| 4 | 20.0 |" in tts.table(result)
