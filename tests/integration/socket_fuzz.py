"""What the socket fuzzers (test_fuzz_sockets.py) send and how they judge what comes back.

- Strategies: every client message of `/v1/tts/ws` (and its vLLM-Omni names) and of
  `/v1/bridge/ws`, valid with random field values or mutated (a field dropped, wrong-typed
  or added, the type renamed), and raw frames (lone UTF-16 surrogate escapes, not JSON,
  binary, fragmented).
- `Transcript`: reads one socket and records every way the server broke its protocol.
- `EchoLLM`: a real OpenAI-compatible streaming server on loopback that speaks back the user's
  first words (a turn starting with `!` gets a 500).
- `Bystander`: a calm client on its own key and thread that speaks utterance after utterance
  and checks each one's units, for as long as a module's fuzzing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
import websockets
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.conftest import wait_for
from tests.integration.wsclient import Client

# ---------------------------------------------------------------------- frames


@dataclass(frozen=True)
class Frame:
    """One client frame: `data` goes out as a text frame (`text`) or a binary one, in
    `fragments` WebSocket frames."""

    data: str | bytes
    text: bool = True
    fragments: int = 1

    @property
    def size(self) -> int:
        return len(self.data.encode() if isinstance(self.data, str) else self.data)

    async def send(self, ws: websockets.ClientConnection) -> None:
        if self.fragments <= 1:
            await ws.send(self.data, text=self.text)
            return
        raw = self.data.encode() if isinstance(self.data, str) else self.data
        step = max(1, -(-len(raw) // self.fragments))  # byte cuts: a UTF-8 character may span two fragments
        parts = [raw[i : i + step] for i in range(0, len(raw), step)] or [b""]
        await ws.send(iter(parts), text=self.text)


def as_frame(message: object) -> Frame:
    """JSON as a client library writes it: ASCII-escaped, so a lone surrogate is a `\\ud800` escape."""
    return Frame(json.dumps(message))


SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
PLAIN = st.text(max_size=24)
WORDS = st.lists(st.sampled_from(["hello", "world", "voxgate", "語", "de", "l'été", "1,000", "—", "ok."]),
                 min_size=1, max_size=8).map(" ".join)  # fmt: skip
TEXT = st.one_of(
    PLAIN,
    WORDS,
    st.builds(lambda a, s, b: a + s + b, PLAIN, SURROGATES, PLAIN),  # a lone surrogate inside
    st.integers(3990, 4010).map(lambda n: ("word " * n)[:n]),  # around the delta limit (4000)
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), PLAIN)
JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(PLAIN, inner, max_size=3), max_leaves=8
)


def _optional(**fields: st.SearchStrategy) -> dict[str, st.SearchStrategy]:
    return fields


def _message(kind: str, **optional: st.SearchStrategy) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"type": st.just(kind)}, optional=optional)


RESUME = st.fixed_dictionaries(
    {},
    optional={"session_id": st.one_of(PLAIN, st.text("0123456789abcdef", min_size=32, max_size=32)),
              "resume_token": PLAIN, "last_unit_index_received": st.integers(-3, 100)},
)  # fmt: skip
RATES = st.one_of(st.sampled_from([8000, 16000, 22050, 24000, 44100, 48000]), st.integers(7990, 48010))
PING = _message("ping", id=st.one_of(st.none(), st.integers(-(2**70), 2**70), TEXT, JSON_VALUES))

TTS_MESSAGES = st.one_of(
    _message("session.start", voice=st.one_of(st.none(), st.sampled_from(["tone", "alloy"]), TEXT),
             language=st.one_of(st.none(), st.sampled_from(["en", "zh", "auto"]), TEXT),
             format=st.one_of(st.sampled_from(["pcm16", "mulaw"]), TEXT), sample_rate=st.one_of(st.none(), RATES),
             binary=st.booleans(), units=st.sampled_from(["words", "chars"]),
             max_pending_units=st.integers(0, 201), pacing=st.booleans(), pacing_lead_ms=st.integers(-1, 5001),
             resume=st.one_of(st.none(), RESUME)),
    _message("text.delta", text=TEXT, first_unit_index=st.one_of(st.none(), st.integers(-1, 60))),
    st.sampled_from(["text.flush", "text.end", "cancel", "session.end"]).map(lambda kind: {"type": kind}),
    PING,
)  # fmt: skip
OMNI_MESSAGES = st.one_of(
    TTS_MESSAGES,
    _message("session.config", voice=st.one_of(st.none(), TEXT), language=TEXT, sample_rate=st.one_of(st.none(), RATES),
             response_format=st.one_of(st.sampled_from(["pcm", "pcm16", "mulaw", "ulaw", "wav"]), TEXT)),
    _message("input.text", text=TEXT),
    st.sampled_from(["input.done", "session.close"]).map(lambda kind: {"type": kind}),
)  # fmt: skip
BRIDGE_MESSAGES = st.one_of(
    _message("config", system=st.one_of(st.none(), TEXT), voice=st.one_of(st.none(), st.just("tone"), TEXT),
             language=st.one_of(st.none(), TEXT), policy=st.one_of(st.sampled_from(["block", "latest"]), TEXT),
             max_tokens=st.integers(0, 4097), temperature=st.floats(-1, 3) | st.floats(), pacing=st.booleans(),
             pacing_lead_ms=st.integers(-1, 10001)),
    _message("user", content=st.one_of(WORDS, TEXT, WORDS.map(lambda w: "!" + w))),  # "~": see LLM_JUNK
    _message("cancel", played_ms=st.one_of(st.none(), st.floats())),
    st.sampled_from(["reset", "history"]).map(lambda kind: {"type": kind}),
    PING,
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, messages: st.SearchStrategy[dict]) -> dict:
    """A valid message with one field dropped, wrong-typed or added, or its type renamed."""
    message = dict(draw(messages))
    key = draw(st.sampled_from(sorted(message)))
    how = draw(st.sampled_from(["drop", "retype", "extra", "rename"]))
    if how == "drop":
        del message[key]
    elif how == "retype":
        message[key] = draw(JSON_VALUES.filter(lambda v: type(v) is not type(message[key])))
    elif how == "extra":
        message[draw(st.one_of(PLAIN, TEXT))] = draw(JSON_VALUES)
    else:
        message["type"] = draw(st.one_of(PLAIN, st.sampled_from(["Ping", "ping ", "session.start\x00"])))
    return message


def raw_frames() -> st.SearchStrategy[Frame]:
    """Frames that are not one JSON object: junk text, other JSON, cut JSON, binary."""
    return st.one_of(
        st.text(max_size=64).map(Frame),
        JSON_VALUES.map(lambda v: Frame(json.dumps(v))),
        st.tuples(PING, st.integers(1, 20)).map(lambda p: Frame(json.dumps(p[0])[: -p[1]])),
        st.binary(max_size=64).map(lambda b: Frame(b, text=False)),
    )


def frames(messages: st.SearchStrategy[dict]) -> st.SearchStrategy[Frame]:
    """Any one client frame for a socket whose messages are `messages`."""
    valid = messages.map(as_frame)
    fragmented = st.tuples(messages, st.integers(2, 5)).map(lambda m: Frame(json.dumps(m[0]), fragments=m[1]))
    return st.one_of(valid, valid, mutated(messages).map(as_frame), raw_frames(), fragmented)


# ---------------------------------------------------------------------- what the server sends


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


TTS_TYPES = frozenset({"session.started", "audio", "units.done", "utterance.done", "session.done", "error", "pong"})
OMNI_TYPES = TTS_TYPES - {"audio", "units.done"} | {"audio.start", "audio.done"}
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
            1000: bool(self.of("session.done")),  # after session.end
            1007: any(f.text and isinstance(f.data, bytes) for f in sent),  # invalid UTF-8 in a text frame
            1008: bool(self.errors(fatal=True)),
            1009: any(f.size > frame_limit for f in sent),
        }
        if not reasons.get(self.close_code, False):  # type: ignore[arg-type]
            last = self.messages[-3:]
            self.problems.append(f"closed with {self.close_code} and no reason the protocol gives; last: {last}")


# ---------------------------------------------------------------------- a time budget


class Budget:
    """One fuzzer's time budget. `@budget.each` (under `@given`): examples run until `seconds`
    after the first; later ones pass unrun, so a slow machine runs a prefix of the same
    examples rather than a longer suite, and `report()` warns how many were left out. Once an
    example has failed every one runs (shrinking and the final replay must see the failure)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.skipped = 0
        self._start: float | None = None
        self._failed = False

    def each(self, example: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(example)
        def run(*args: Any, **kwargs: Any) -> None:
            now = time.monotonic()
            self._start = now if self._start is None else self._start
            if not self._failed and now - self._start > self.seconds:
                self.skipped += 1
                return
            try:
                example(*args, **kwargs)
            except BaseException:
                self._failed = True
                raise

        return run

    def report(self) -> None:
        if self.skipped:
            warnings.warn(f"{self.skipped} examples not run: over the {self.seconds:g} s budget", stacklevel=2)


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
