"""`voxgate chat`: talk to the bridge from a terminal; the replies are spoken as they are written.

Connects to a running server's `/v1/bridge/ws` (the server keeps the conversation), sends each
line typed (or each `--say`) as a user turn, prints the reply's segments as they start
speaking, and plays the audio through a player command (`--play`, found automatically among
aplay / paplay / ffplay) or writes one WAV per reply (`--out`, default ./voxgate-chat/). Ctrl-C while a reply speaks
stops it (barge-in; the history keeps what was played); Ctrl-C at the prompt or Ctrl-D quits.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from voxgate.types import VoxgateError

if TYPE_CHECKING:  # imported when the command runs, so building the CLI parser stays light
    from websockets.sync.client import ClientConnection

_PLAYERS = {
    "aplay": "aplay -q -t raw -f S16_LE -c 1 -r {rate}",
    "paplay": "paplay --raw --format=s16le --channels=1 --rate={rate}",
    "ffplay": "ffplay -loglevel quiet -nodisp -autoexit -f s16le -ch_layout mono -ar {rate} -i -",
}


class ChatError(VoxgateError):
    code = "chat_failed"


class Refused(VoxgateError):
    """The server refused a message (a config, a turn): its `error` as the CLI's error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the voxgate server (default :8000)")
    parser.add_argument("--say", action="append", help="a user turn (repeatable); default: read lines from stdin")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--voice", help="voice id (default: the server's)")
    parser.add_argument("--max-tokens", type=int, default=200, help="longest reply in LLM tokens (default 200)")
    parser.add_argument("--temperature", type=float, help="LLM temperature (default: the LLM server's)")
    parser.add_argument("--play", help="player command reading raw s16le mono PCM on stdin ({rate} is filled in)")
    parser.add_argument(
        "--out", help="write each reply as DIR/reply-N.wav (default ./voxgate-chat when no player is found)"
    )
    parser.add_argument("--api-key", help="bearer token, when the server has API keys")


class Sink(Protocol):
    def write(self, pcm: bytes) -> None: ...

    def played_ms(self) -> float | None: ...

    def close(self) -> None: ...


class PlayerSink:
    """Raw PCM into a player's stdin; played time estimated from the first audio on."""

    def __init__(self, command: str, rate: int) -> None:
        self.rate, self.started, self.sent = rate, 0.0, 0
        self.proc = subprocess.Popen(command.format(rate=rate).split(), stdin=subprocess.PIPE)

    def write(self, pcm: bytes) -> None:
        self.started = self.started or time.perf_counter()
        self.sent += len(pcm)
        assert self.proc.stdin is not None
        self.proc.stdin.write(pcm)
        self.proc.stdin.flush()

    def played_ms(self) -> float | None:
        if not self.started:
            return 0.0
        return min(1000 * (time.perf_counter() - self.started), 1000 * self.sent / 2 / self.rate)

    def close(self) -> None:
        self.proc.kill()  # a stopped reply must fall silent at once, not drain its buffer
        self.proc.wait()


class WavSink:
    def __init__(self, path: Path, rate: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.wav = path, wave.open(str(path), "wb")  # noqa: SIM115  # closed by close()
        self.wav.setnchannels(1)
        self.wav.setsampwidth(2)
        self.wav.setframerate(rate)

    def write(self, pcm: bytes) -> None:
        self.wav.writeframes(pcm)

    def played_ms(self) -> float | None:
        return None  # nothing is played: the server records what it sent

    def close(self) -> None:
        self.wav.close()


def run_chat(args: argparse.Namespace) -> int:
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect

    player = args.play or next((cmd for name, cmd in _PLAYERS.items() if shutil.which(name)), None)
    if player and not shutil.which(player.split()[0]):  # else Popen fails as if the server had
        raise ChatError(f"no player {player.split()[0]!r}: --play takes a command on PATH (or --out DIR writes WAVs)")
    out = Path(args.out or "voxgate-chat") if args.out or not player else None
    base = args.url.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else None
    try:
        with connect(base + "/v1/bridge/ws", additional_headers=headers, open_timeout=10) as ws:
            ready = _recv(ws)
            config = {"type": "config", "system": args.system, "voice": args.voice, "max_tokens": args.max_tokens,
                      "temperature": args.temperature}  # fmt: skip
            ws.send(json.dumps({k: v for k, v in config.items() if v is not None}))
            _confirm(ws)
            where = f"writing WAVs to {out}/" if out else f"playing with {player.split()[0]}"
            print(f"connected to {args.url} ({where}); Ctrl-C stops a reply, Ctrl-D quits", file=sys.stderr)
            for turn, line in enumerate(_turns(args.say), start=1):
                sink: Sink = WavSink(out / f"reply-{turn}.wav", ready["sample_rate"]) if out else PlayerSink(
                    player, ready["sample_rate"])  # fmt: skip
                ws.send(json.dumps({"type": "user", "content": line}))
                try:
                    _speak(ws, sink)
                finally:
                    sink.close()
    except (OSError, WebSocketException, TimeoutError) as exc:
        raise ChatError(f"cannot talk to {base}/v1/bridge/ws: {type(exc).__name__}: {exc}") from None
    return 0


def _turns(said: list[str] | None) -> Any:
    if said:
        yield from said
        return
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        if line:
            yield line


def _speak(ws: ClientConnection, sink: Sink) -> None:
    """Print and play one reply until its `done`; Ctrl-C sends a cancel and waits for it."""
    print("voxgate> ", end="", flush=True)
    stopping = False
    while True:
        try:
            message = ws.recv()
            if isinstance(message, bytes):
                sink.write(message)
                continue
            event = json.loads(message)
            if event["type"] == "segment":
                print(event["text"], end=" ", flush=True)
            elif event["type"] == "error" and event["code"] != "nothing_to_cancel":  # that: the reply ended first
                print()
                raise Refused(event["code"], event["message"])  # the turn was refused: no `done` will come
            elif event["type"] == "done":
                _report(event)
                return
        except KeyboardInterrupt:
            if stopping:
                raise
            stopping = True
            played = sink.played_ms()
            ws.send(json.dumps({"type": "cancel", **({"played_ms": played} if played is not None else {})}))


def _report(done: dict[str, Any]) -> None:
    t = done.get("timings_ms", {})
    cut = " [stopped]" if done["status"] == "cancelled" else ""
    failed = f" [failed: {done.get('code')}: {done.get('message')}]" if done["status"] == "failed" else ""
    print(cut + failed)
    if "first_audio" in t:
        gap = t["first_audio"] - t.get("llm_first_token", 0)
        cached = ", opener from the starter cache" if done.get("starter_cached") else ""
        print(f"  (LLM first token {t.get('llm_first_token')} ms, first audio {t['first_audio']} ms: +{gap:.0f} ms"
              f"{cached}; {done['segments']} segments)", file=sys.stderr)  # fmt: skip


def _confirm(ws: ClientConnection) -> None:
    """The config takes effect or is refused (a voice not served, a temperature out of range)
    before the `pong` of a ping sent after it: a refusal ends the chat, as `voxgate say` ends."""
    ws.send(json.dumps({"type": "ping", "id": "config"}))
    while (event := json.loads(ws.recv(timeout=30)))["type"] != "pong":
        if event["type"] == "error":
            raise Refused(event["code"], event["message"])


def _recv(ws: ClientConnection) -> dict[str, Any]:
    message = ws.recv(timeout=30)
    event = json.loads(message) if isinstance(message, str) else {}
    if event.get("type") != "ready":
        raise ChatError(f"unexpected first message from the server: {str(message)[:200]}")
    return event
