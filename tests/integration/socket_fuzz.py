"""What the socket fuzzers (test_fuzz_sockets.py) send: every client message of `/v1/tts/ws`
(and its vLLM-Omni names) and of `/v1/bridge/ws`, valid with random field values or mutated
(a field dropped, wrong-typed or added, the type renamed), and raw frames (lone UTF-16
surrogate escapes, not JSON, binary, fragmented); and `Budget`, a fuzzer's time budget (a slow
machine runs a prefix of the same examples). How the answers are judged: socket_check.py.
"""

from __future__ import annotations

import functools
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import websockets
from hypothesis import strategies as st

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


def _message(kind: str, **optional: st.SearchStrategy) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"type": st.just(kind)}, optional=optional)


RESUME = st.fixed_dictionaries(
    {},
    optional={"session_id": st.one_of(PLAIN, st.text("0123456789abcdef", min_size=32, max_size=32)),
              "resume_token": PLAIN, "last_unit_index_received": st.integers(-3, 100)},
)  # fmt: skip
RATES = st.one_of(st.sampled_from([8000, 16000, 22050, 24000, 44100, 48000]), st.integers(7990, 48010))
PING = _message("ping", id=st.one_of(st.none(), st.integers(-(2**70), 2**70), TEXT, JSON_VALUES))

FORMATS = ("pcm16", "mulaw", "mp3", "opus", "aac", "flac")  # served and not, on each socket
TTS_MESSAGES = st.one_of(
    _message("session.start", voice=st.one_of(st.none(), st.sampled_from(["tone", "alloy"]), TEXT),
             language=st.one_of(st.none(), st.sampled_from(["en", "zh", "auto"]), TEXT),
             format=st.one_of(st.sampled_from(FORMATS), TEXT), sample_rate=st.one_of(st.none(), RATES),
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
             response_format=st.one_of(st.sampled_from(("wav", "pcm", *FORMATS)), TEXT)),
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


MESSAGES = {"tts": TTS_MESSAGES, "omni": OMNI_MESSAGES, "bridge": BRIDGE_MESSAGES}
START = as_frame({"type": "session.start"})


def sequences(protocol: str) -> st.SearchStrategy[list[Frame]]:
    """A few frames, often after a valid session.start (so in-session paths get fuzzed)."""
    opening = st.sampled_from([[], [START]] if protocol != "bridge" else [[]])
    return st.tuples(opening, st.lists(frames(MESSAGES[protocol]), max_size=10)).map(lambda p: p[0] + p[1])


def scripted(*messages: dict) -> list[Frame]:
    return [as_frame(m) for m in messages]


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
