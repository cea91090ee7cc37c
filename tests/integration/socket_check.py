"""How the socket fuzzers (test_fuzz_sockets.py) judge a real server's answers, and what runs
beside them.

- `Transcript`: reads one socket and records every way the server broke its protocol.
- `Target`, `exchange`, `fuzz`: one fuzzed server; one exchange with it; the properties every
  exchange must keep (alive, /healthz, no traceback in its log).
- `EchoLLM`: a real OpenAI-compatible streaming server on loopback that speaks back the user's
  first words (a turn starting with `!` gets a 500, one starting with `~` junk).
- `Bystander`: a calm client on its own key and thread that speaks utterance after utterance
  and checks each one's units, for as long as a module's fuzzing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import uvicorn
import websockets
from hypothesis import currently_in_test_context, event
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.conftest import wait_for
from tests.integration.socket_fuzz import Frame
from tests.integration.wsclient import Client
from voxgate.bench.server import ServerProcess
from voxgate.serving.transport import WS_FRAME_SLACK

MAX_MESSAGE = 65536  # VOXGATE_WS_MAX_MESSAGE_BYTES (the default)
FRAME_LIMIT = MAX_MESSAGE + WS_FRAME_SLACK  # larger frames are refused by the protocol (1009)
PATHS = {"tts": "/v1/tts/ws", "omni": "/v1/audio/speech/stream", "bridge": "/v1/bridge/ws"}
UVICORN_UTF8 = "Invalid UTF-8 sequence received from client."
LOG_MARK = "Invalid HTTP request received."  # uvicorn's warning for a request that is not HTTP


# ---------------------------------------------------------------------- what the server sends


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


TTS_TYPES = frozenset({"session.started", "audio", "units.done", "utterance.done", "session.done", "error", "pong"})
OMNI_TYPES = frozenset({"audio.start", "audio.done", "session.done", "error", "pong"})  # vLLM-Omni's (serving/omni.py)
BRIDGE_TYPES = frozenset({"ready", "reply.start", "segment", "done", "error", "pong", "history"})


@dataclass
class Transcript:
    """Every frame the server sent on one socket, and each way it broke the protocol:
    a frame that is not JSON with a known `type`, an error without `code`/`message`/`fatal`,
    a binary frame not announced by its header, a close with no reason the protocol gives."""

    protocol: str  # "tts", "omni" or "bridge"
    messages: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    close_code: int | None = None  # the server's close (None: no close frame, or we closed first)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    left: bool = False  # the client closed the socket first
    _binary_due: int | None = None  # tts: bytes the next frame must carry (after an `audio` header)
    _binary_open: bool = False  # omni/bridge: binary frames may come now

    def take(self, frame: str | bytes) -> None:
        if isinstance(frame, bytes):
            self._binary(frame)
            return
        if self._binary_due is not None:
            self.problems.append(f"an audio header's {self._binary_due} bytes did not follow it: {frame[:200]}")
            self._binary_due = None
        try:
            message = _strict_json(frame)
        except ValueError as exc:
            self.problems.append(f"not JSON ({exc}): {frame[:200]}")
            return
        if not isinstance(message, dict) or message.get("type") not in self._types():
            self.problems.append(f"not a known message: {frame[:200]}")
            return
        self.messages.append(message)
        self._track(message)

    def _types(self) -> frozenset[str]:
        return {"tts": TTS_TYPES, "omni": OMNI_TYPES, "bridge": BRIDGE_TYPES}[self.protocol]

    def _binary(self, frame: bytes) -> None:
        if self.protocol == "tts":
            if self._binary_due != len(frame):
                self.problems.append(f"a binary frame of {len(frame)} bytes; its header announced {self._binary_due}")
            self._binary_due = None
        elif not self._binary_open:
            self.problems.append(f"a binary frame of {len(frame)} bytes outside a segment's audio")

    def _track(self, message: dict) -> None:
        kind = message["type"]
        if kind == "error":
            fields = (message.get("code"), message.get("message"), message.get("fatal"))
            if not (isinstance(fields[0], str) and fields[0] and isinstance(fields[1], str)
                    and isinstance(fields[2], bool)):  # fmt: skip
                self.problems.append(f"an error without code, message and fatal: {message}")
        elif kind == "audio" and "data" not in message:
            self._binary_due = message.get("bytes")
        elif kind in ("audio.start", "segment"):
            self._binary_open = True
        elif kind in ("audio.done", "done"):
            self._binary_open = False

    def check_units(self) -> None:
        """tts, once session.done came: each utterance's units (from the last one's `unit_end` + 1
        to its own) are reported by `units.done` ranges in order, without overlap, every one of
        them if it completed (a cancelled one counts its rest as done); session.done counts them all."""
        ranges = [(m["unit_start"], m["unit_end"], m["utterance"]) for m in self.of("units.done")]
        first = 0
        for number, done in enumerate(self.of("utterance.done")):
            mine = [(lo, hi) for lo, hi, utterance in ranges if utterance == number]
            covered = [u for lo, hi in mine for u in range(lo, hi + 1)]
            spoken = list(range(first, done["unit_end"] + 1))
            whole = covered == spoken if done["status"] == "completed" else covered == sorted(set(covered))
            if done["utterance"] != number or not whole or not set(covered) <= set(spoken):
                self.problems.append(f"utterance {done}: units.done covered {mine}, its units are {first}..")
            first = done["unit_end"] + 1
        if any(utterance >= len(self.of("utterance.done")) for *_, utterance in ranges):
            self.problems.append(f"units.done of an utterance that never ended: {ranges}")
        counted = self.of("session.done")[-1]["units"]
        if counted != first:
            self.problems.append(f"session.done counts {counted} units, the utterances {first}")

    def errors(self, fatal: bool | None = None) -> list[dict]:
        return [m for m in self.messages if m["type"] == "error" and (fatal is None or m["fatal"] is fatal)]

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.messages if m["type"] == kind]

    async def read(self, ws: websockets.ClientConnection) -> None:
        """Take frames until the socket closes; the server's close code is kept."""
        with contextlib.suppress(websockets.ConnectionClosed):
            async for frame in ws:
                self.take(frame)
        received = ws.protocol.close_rcvd
        if not self.left:
            self.close_code = received.code if received is not None else None
        self.closed.set()

    def check_close(self, sent: list[Frame], frame_limit: int) -> None:
        """The server may close only for a reason the protocol gives (docs/protocol.md)."""
        if not self.closed.is_set():
            if self.errors(fatal=True):
                self.problems.append("a fatal error did not close the socket")
            return
        reasons = {
            1000: bool(self.of("session.done")) or (self.protocol == "omni" and _ends(sent)),  # after session.end
            1007: any(f.text and isinstance(f.data, bytes) for f in sent),  # invalid UTF-8 in a text frame
            1008: bool(self.errors(fatal=True)),
            1009: any(f.size > frame_limit for f in sent),
        }
        if not reasons.get(self.close_code, False):  # type: ignore[arg-type]
            last = self.messages[-3:]
            self.problems.append(f"closed with {self.close_code} and no reason the protocol gives; last: {last}")


def _ends(sent: list[Frame]) -> bool:
    """vLLM-Omni's path closes after session.close (ours: session.end) with no message of its own."""
    return any(isinstance(f.data, str) and ('"session.close"' in f.data or '"session.end"' in f.data) for f in sent)


# ---------------------------------------------------------------------- the target


@dataclass
class Target:
    """One fuzzed server, its bystander, and what the server was before the fuzzing."""

    server: ServerProcess
    bystander: Bystander | None
    headers: dict[str, str]
    rss_before: int

    def url(self, protocol: str) -> str:
        return self.server.url.replace("http://", "ws://") + PATHS[protocol]

    def assert_unharmed(self, allowed: tuple[str, ...] = ()) -> None:
        """Alive, /healthz answers, and no traceback logged (but one preceded by an `allowed` line)."""
        assert self.server.returncode is None, "the server died:\n" + "\n".join(self.server.log)
        assert httpx.get(self.server.url + "/healthz", timeout=30).status_code == 200
        lines = self._log_until_now()
        for n, line in enumerate(lines):
            failed = any(sign in line for sign in ("Traceback", "Exception in ASGI application", "never retrieved"))
            if failed and not (n and any(a in lines[n - 1] for a in allowed)):
                raise AssertionError("the server logged a traceback:\n" + "\n".join(lines[max(0, n - 2) : n + 30]))

    def _log_until_now(self) -> list[str]:
        """The server's log lines not read before, up to now: a request that is not HTTP makes
        uvicorn log a warning before it answers 400, so once that line is read, so is all before it."""
        host, port = self.server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"NOT HTTP\r\n\r\n")
            sock.recv(1024)
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while not (lines and LOG_MARK in lines[-1]) and time.monotonic() < deadline:
            while self.server.log and not (lines and LOG_MARK in lines[-1]):
                lines.append(self.server.log.popleft())
            time.sleep(0.005)
        assert lines and LOG_MARK in lines[-1], "the server's log did not come"
        return lines


# ---------------------------------------------------------------------- one exchange


async def exchange(target: Target, protocol: str, sent: list[Frame], timeout: float = 120) -> Transcript:
    """Send `sent` as fast as the socket takes them, then a `ping` sentinel; read everything
    until its `pong` (and, on the bridge, every started reply's `done`) or the close."""
    transcript = Transcript(protocol)
    async with websockets.connect(target.url(protocol), additional_headers=target.headers, max_size=None) as ws:
        reader = asyncio.create_task(transcript.read(ws))
        sentinel, done = f"sentinel-{secrets.token_hex(4)}", []
        try:
            for frame in sent:
                done.append(frame)
                await frame.send(ws)
            await ws.send(json.dumps({"type": "ping", "id": sentinel}))
        except websockets.ConnectionClosed:
            pass
        try:
            await asyncio.wait_for(_settled(transcript, sentinel), timeout)
            if _session_open(transcript):  # end it, so every unit is accounted for
                await _end_session(ws, transcript, timeout)
            elif transcript.of("session.done") and (protocol != "omni" or _ends(done)):
                # The server's close (1000) follows; it may not be here yet. On vLLM-Omni's path a
                # session.done ends an utterance (the socket stays for the next) unless the client
                # ended the session: waiting for a close there hung whenever that session.done
                # came before the sentinel's pong (`session.config`, `input.done`: no text to voice).
                await asyncio.wait_for(transcript.closed.wait(), timeout)
        except TimeoutError:
            transcript.problems.append(f"no answer and no close within {timeout} s (a hang)")
        transcript.check_close(done, FRAME_LIMIT)
        if protocol == "tts" and transcript.of("session.done"):
            transcript.check_units()
        transcript.left = not transcript.closed.is_set()
    await asyncio.wait_for(reader, 30)
    return transcript


def _session_open(t: Transcript) -> bool:
    return not t.closed.is_set() and bool(t.of("session.started")) and not t.of("session.done")


async def _end_session(ws: websockets.ClientConnection, t: Transcript, timeout: float) -> None:
    """`cancel` (a paced utterance of 4,000 characters would take minutes), then `session.end`:
    session.done and a 1000 close must follow."""
    with contextlib.suppress(websockets.ConnectionClosed):
        await ws.send(json.dumps({"type": "cancel"}))
        await ws.send(json.dumps({"type": "session.end"}))
    await asyncio.wait_for(t.closed.wait(), timeout)


async def _settled(t: Transcript, sentinel: str) -> None:
    def settled() -> bool:
        if t.closed.is_set():
            return True
        answered = any(m["type"] == "pong" and m.get("id") == sentinel for m in t.messages)
        return answered and len(t.of("done")) >= len(t.of("reply.start"))

    while not settled():
        await asyncio.sleep(0.01)


def fuzz(target: Target, protocol: str, sent: list[Frame]) -> Transcript:
    """One exchange, then the per-example properties."""
    transcript = asyncio.run(exchange(target, protocol, sent))
    assert not transcript.problems, transcript.problems
    target.assert_unharmed(allowed=(UVICORN_UTF8,))
    if currently_in_test_context():  # what the examples reached, with --hypothesis-show-statistics
        for kind in {m.get("code", m["type"]) for m in transcript.messages}:
            event(kind)
        event(f"closed {transcript.close_code}")
    return transcript


# ---------------------------------------------------------------------- a real stand-in LLM


class EchoLLM:
    """An OpenAI-compatible streaming chat server on loopback (a thread): answers with the
    first words of the last user message, a word per event; `!...` gets a 500, and `~...` an
    answer no model should write (a lone surrogate, control characters, an empty delta)."""

    def __init__(self) -> None:
        app = Starlette(routes=[Route("/v1/chat/completions", self._completions, methods=["POST"])])
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"

    def __enter__(self) -> EchoLLM:
        self._thread.start()
        assert wait_for(lambda: self._server.started, timeout=30)
        return self

    def __exit__(self, *_: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    async def _completions(self, request: Request):
        content = str((await request.json())["messages"][-1]["content"])
        if content.startswith("!"):
            return JSONResponse({"error": "refused"}, status_code=500)
        words = content.split()[:12] or ["nothing"]
        if content.startswith("~"):
            words = ["bad\ud800", "\x00nul\x1b[2J", "", "\u202eevil", "ok."]
        return StreamingResponse(self._events(words), media_type="text/event-stream")

    @staticmethod
    async def _events(words: list[str]) -> Iterator[str]:  # type: ignore[misc]
        for word in words:
            yield "data: " + json.dumps({"choices": [{"delta": {"content": word + " "}}]}) + "\n\n"
        yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------- a calm client alongside


class Bystander:
    """A client on its own key speaking utterance after utterance on `/v1/tts/ws`, in a thread
    of its own, for as long as it runs: each utterance must end `completed` with every unit it
    sent reported done exactly once and no error. `check()` says what went wrong so far."""

    SENTENCE = "calm words spoken while others fuzz the server"

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url, self.headers = url, headers
        self.utterances = 0
        self.problems: list[str] = []
        self.started: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Bystander:
        self._thread.start()
        assert wait_for(lambda: self.utterances > 0 or self.problems, timeout=60), "the bystander never spoke"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def check(self, since: int) -> None:
        """No problem so far, and at least one more utterance than `since` (it was not stalled)."""
        assert wait_for(lambda: self.utterances > since or self.problems, timeout=60), "the bystander stalled"
        assert not self.problems, self.problems

    async def _run(self) -> None:
        try:
            async with websockets.connect(self.url, additional_headers=self.headers) as ws:
                c = Client(ws)
                self.started = await c.start(max_pending_units=3)
                while not self._stop.is_set():
                    await self._utterance(c)
                    await asyncio.sleep(0.05)  # ~100 messages/s: well under the socket's rate limit
        except Exception as exc:
            self.problems.append(f"the bystander failed: {exc!r}")

    async def _utterance(self, c: Client) -> None:
        first = c.units
        c.messages.clear()
        await c.words(self.SENTENCE)
        await c.send(type="text.end")
        done = await c.until("utterance.done", timeout=120)
        covered = [u for m in c.of("units.done") for u in range(m["unit_start"], m["unit_end"] + 1)]
        if done["status"] != "completed" or covered != list(range(first, c.units)) or c.of("error"):
            self.problems.append(f"utterance {done}: units {covered}, expected {first}..{c.units - 1}; "
                                 f"errors {c.of('error')}")  # fmt: skip
        self.utterances += 1
