"""The command line as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import wave

import pytest

from voxgate.bench.http import BurstStreamFailed, _series, burst
from voxgate.bench.server import ServerProcess
from voxgate.cli import main


def voxgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxgate", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_serve_refuses_ray_options_without_replicas():
    result = voxgate("serve", "--engine", "tone", "--ingress", "haproxy")
    assert result.returncode != 0 and "need --replicas N" in result.stderr


def test_say_writes_a_wav(tmp_path):
    out = tmp_path / "hello.wav"
    result = voxgate("say", "hello there world", "-o", str(out), "--engine", "tone", "--sample-rate", "16000")
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    with wave.open(str(out)) as w:
        assert w.getframerate() == 16000 and w.getnframes() == 3 * 1920


@pytest.mark.parametrize(("name", "codec"), [("hello.mp3", "mp3"), ("hello.ogg", "opus"), ("hello.flac", "flac")])
def test_say_encodes_as_the_file_name_says(tmp_path, name, codec):
    """Not a WAV under another name: the file decodes as its codec, and all the audio is there."""
    import av

    out = tmp_path / name
    result = voxgate("say", "hello there world", "-o", str(out), "--engine", "tone", "--sample-rate", "24000")
    assert result.returncode == 0, result.stderr
    with av.open(str(out)) as container:
        stream = container.streams.audio[0]
        seconds = sum(frame.samples for frame in container.decode(stream)) / stream.rate
        assert stream.codec_context.name.startswith(codec)  # mp3float decodes mp3
    assert seconds >= 3 * 1920 / 16000  # the tone's three words (codec padding may add a frame)


def test_say_with_piper(tmp_path):
    out = tmp_path / "piper.wav"
    result = voxgate("say", "Good morning.", "-o", str(out))
    assert result.returncode == 0, result.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 22050 and w.getnframes() > 5000


def test_say_reports_bad_input_clearly(tmp_path):
    result = voxgate("say", "x", "-o", str(tmp_path / "x.wav"), "--engine", "nope")
    assert result.returncode == 2 and "unknown_engine" in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("say", "Hi.", "-o", "/nonexistent/dir/a.wav", "--engine", "tone"), {},
         "os_error: No such file or directory: /nonexistent/dir/a.wav"),
        (("say", "Hi.", "-o", "/nonexistent/dir/a.txt", "--engine", "tone"), {},
         "unsupported_format: cannot tell the audio format of '/nonexistent/dir/a.txt' from its extension"),
        (("serve", "--port", "99999"), {}, "invalid_settings: port (VOXGATE_PORT): Input should be less than"),
        (("voices", "--engine", "tone"), {"VOXGATE_LOG_LEVEL": "loud"},
         "invalid_settings: log_level (VOXGATE_LOG_LEVEL)"),
        (("voices", "--engine", "tone"), {"VOXGATE_QWEN3_MODEL": "/a", "VOXGATE_QWEN3_MODEL_DIR": "/b"},
         "invalid_settings: Value error, VOXGATE_QWEN3_MODEL (/a) and VOXGATE_QWEN3_MODEL_DIR (/b) name different"),
    ],
)  # fmt: skip
def test_a_bad_path_or_setting_is_one_line_and_exit_2(args, env, says):
    result = voxgate(*args, env={**os.environ, **env})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"voxgate: error: {says}") and result.stderr.count("\n") == 1, result.stderr


def test_the_regress_help_names_every_regress_command(capsys):
    for argv in (["regress", "--help"], ["--help"]):
        with pytest.raises(SystemExit):
            main(argv)
    regress_help, top_help = capsys.readouterr().out.split("usage: voxgate [-h]")
    commands = re.search(r"\{([a-z0-9,-]+)\}", regress_help).group(1).split(",")  # what `voxgate regress` takes
    assert {"tts", "e2e"} <= set(commands)
    listed = "".join(f"regression gates and golden baselines: {', '.join(commands)}".split())
    assert listed in "".join(regress_help.split()) and listed in "".join(top_help.split())  # however it wraps


def test_voices_lists_the_engine_voices():
    result = voxgate("voices", "--engine", "tone")
    assert result.returncode == 0 and result.stdout.splitlines()[0].startswith("tone\t")


def test_bench_http_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = voxgate("bench", "http", "--engines", "tone", "--n", "3", "--warmup", "1", "--concurrency", "3",
                     "--output-json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(out.read_text())
    tone = report["results"]["tone"]
    assert tone["ten_words"]["server_ttfa_ms"]["n"] == 3
    assert tone["starter_hit"]["starter_hits"] == 3
    assert report["machine"]["cores"] >= 1
    burst = tone["concurrent_3"]
    audio = burst["audio_s"]["p50"] * 3  # the same sentence three times
    assert burst["audio_s_per_s"] == pytest.approx(audio / burst["wall_s"], rel=0.03)  # both rounded


def test_bench_http_times_a_server_already_running(tmp_path):
    """`--url`: a server someone else started (e.g. replicas behind Ray's proxy); with its admin key
    the server's own timings come too."""
    out = tmp_path / "bench.json"
    with ServerProcess("tone") as server:
        key = server.env["VOXGATE_ADMIN_KEYS"].split(",")[0]
        result = voxgate("bench", "http", "--engines", "tone", "--url", server.url, "--admin-key", key, "--n", "2",
                         "--warmup", "0", "--concurrency", "4", "--client-procs", "2",
                         "--output-json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    report = json.loads(out.read_text())
    tone = report["results"]["tone"]
    assert "startup_s" not in tone and f"--url {server.url}" in report["command"]
    assert tone["ten_words"]["client_ttfa_ms"]["n"] == tone["ten_words"]["server_ttfa_ms"]["n"] == 2
    burst = tone["concurrent_4"]  # two client processes of two streams: every stream once, the server's too
    assert burst["client_procs"] == 2 and burst["client_ttfa_ms"]["n"] == burst["server_ttfa_ms"]["n"] == 4
    assert burst["wall_s"] * 1000 >= burst["client_total_ms"]["max"] - 1  # the wall spans every stream
    assert burst["audio_s_per_s"] > 0
    two = voxgate("bench", "http", "--engines", "tone,piper", "--url", server.url)
    assert two.returncode != 0 and "one running server" in two.stderr


def test_a_burst_from_client_processes_says_which_stream_failed_and_how():
    """A stream refused in a client process reaches the caller as the refusal (its status), not
    as a broken process pool; and a burst reports the client processes it ran in, at most one a
    stream."""
    with ServerProcess("tone") as server:
        with pytest.raises(BurstStreamFailed, match=r"stream bad-\d: HTTPStatusError: .*\b4\d\d\b"):
            burst(server.url, "hello there", [f"bad-{i}" for i in range(4)], "no-such-format", 2, 2)
        result = _series(server.url, "hello there", 3, 0, 2, {}, procs=8)
    assert result["client_procs"] == 2 and result["client_ttfa_ms"]["n"] == 3


def test_bench_abuse_floods_as_another_client_and_writes_json(tmp_path):
    out = tmp_path / "abuse.json"
    result = voxgate("bench", "abuse", "--kinds", "tts.blank,http.bad_json", "--messages", "300",
                     "--baseline-s", "1", "--output-json", str(out))  # fmt: skip
    assert result.returncode in (0, 1), result.stderr + result.stdout  # 1: a target missed (timing is measured)
    report = json.loads(out.read_text())
    assert report["clients"] == "flooder and bystander: two API keys"
    assert report["server"]["settings"]["API_KEYS"] == "<redacted>"
    for kind in ("tts.blank", "http.bad_json"):
        row = report["floods"][kind]
        assert row["flood"]["sent"] == 300 and row["bystander_errors"] == []  # the flood's caps are not the bystander's
        assert {"p50", "p99"} <= row["audio_ms"].keys() and isinstance(row["met"], bool)
    assert report["floods"]["http.bad_json"]["flood"]["errors"] == {"400": 300}
    assert "| tts.blank | 300 |" in result.stdout
