"""`voxgate chat` against a real server: turns in, replies printed and written as WAVs."""

from __future__ import annotations

import socket
import subprocess
import sys
import wave


def _chat(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "voxgate", "chat", *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300)


def test_chat_speaks_each_turn_and_keeps_the_conversation(bridge, tmp_path):
    result = _chat("--url", bridge.url, "--out", str(tmp_path), "--max-tokens", "25", "--temperature", "0",
                   stdin="What is the capital of France?\n\nAnd of Italy?\n")  # fmt: skip
    assert result.returncode == 0, result.stderr
    replies = [line.split("voxgate> ", 1)[1] for line in result.stdout.splitlines() if "voxgate> " in line]
    assert len(replies) == 2 and all(len(reply.split()) >= 3 for reply in replies)  # the empty line is no turn
    assert result.stderr.count("first audio") == 2 and f"writing WAVs to {tmp_path}" in result.stderr
    for n in (1, 2):
        with wave.open(str(tmp_path / f"reply-{n}.wav")) as w:
            assert w.getframerate() == 22050 and w.getnframes() > 0.5 * 22050


def test_chat_says_clearly_when_there_is_no_server(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = _chat("--url", f"http://127.0.0.1:{port}", "--say", "hi", "--out", str(tmp_path))
    assert result.returncode == 2 and "cannot talk to ws://127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_refused_config_ends_the_chat_as_say_does(tone_server, tmp_path):
    """The bridge socket refuses the config (no LLM is needed to): one line, exit 2, no turn sent."""
    for flag, value, code in (("--voice", "nope", "unknown_voice"), ("--temperature", "9", "invalid_message")):
        result = _chat("--url", tone_server.url, "--say", "Hi.", "--out", str(tmp_path), flag, value)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[-1].startswith(f"voxgate: error: {code}: "), result.stderr
        assert "voxgate> " not in result.stdout and "Traceback" not in result.stderr


def test_a_missing_player_is_named_not_blamed_on_the_server(tone_server):
    result = _chat("--url", tone_server.url, "--say", "Hi.", "--play", "/nonexistent/player")
    assert result.returncode == 2 and "/nonexistent/player" in result.stderr, result.stderr
    assert "cannot talk to" not in result.stderr and "Traceback" not in result.stderr
