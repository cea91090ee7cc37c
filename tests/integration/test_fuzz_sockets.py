"""Property-based fuzzing of every client message of the WebSocket sockets (issue 16):
`/v1/tts/ws`, its vLLM-Omni twin `/v1/audio/speech/stream` and `/v1/bridge/ws`, against a real
`voxgate serve` (tone engine) over real sockets. What is sent is in
`socket_fuzz.py`, how the answers are judged in `socket_check.py`.

After every generated exchange: the server is alive and /healthz answers; every frame it sent
is JSON with a known `type` (errors with `code`, `message`, `fatal`) or a binary frame its
header announced; it closed the socket only for a reason the protocol gives (a fatal error,
session.done, a frame over the limit, invalid UTF-8), never for a non-fatal error; its log
holds no traceback; a TTS session left open is ended (cancel, session.end) and every unit it
took is accounted for by `units.done` and `utterance.done`. After every test: a bystander on
another key, speaking all along, got every unit it sent and no error. After the module: every
fuzzed session has ended and the server's RSS is within `RSS_BOUND` of what it was before.

Deterministic: `derandomize=True`, no example database, a fixed number of examples each (and
a time budget per test: a slow machine runs a prefix of them, with a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator

import pytest
import websockets
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from tests.conftest import metric, wait_for
from tests.integration.socket_check import (
    FRAME_LIMIT,
    MAX_MESSAGE,
    PATHS,
    UVICORN_UTF8,
    Bystander,
    EchoLLM,
    Target,
    exchange,
    fuzz,
)
from tests.integration.socket_fuzz import (
    MESSAGES,
    START,
    TTS_MESSAGES,
    Budget,
    Frame,
    as_frame,
    frames,
    scripted,
    sequences,
)
from voxgate.bench.server import ServerProcess

FUZZ_KEY, CALM_KEY = "fuzz-key-3b9e1c", "calm-key-8d2f47"
RATE, BURST = 100, 1000  # VOXGATE_WS_MESSAGES_PER_S / _BURST: a flood of FLOOD messages is limited
FLOOD = 3000  # unless the server took over (FLOOD - BURST) / RATE = 20 s to read them
RSS_BOUND = 64 << 20
RESUME_WINDOW_S = 1.0  # short: a fuzzed session left open ends soon after


def fuzz_settings(examples: int):
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


# ---------------------------------------------------------------------- the servers


@contextlib.contextmanager
def _start(env: dict[str, str], calm: bool) -> Iterator[Target]:
    with ServerProcess("tone", env={"LOG_LEVEL": "warning", "WS_RESUME_WINDOW_S": str(RESUME_WINDOW_S),
                                    "WS_MESSAGES_PER_S": str(RATE), "WS_MESSAGE_BURST": str(BURST),
                                    **env}) as server:  # fmt: skip
        headers = {"Authorization": f"Bearer {FUZZ_KEY}"} if "API_KEYS" in env else {}
        if not calm:
            yield Target(server, None, headers, server.rss_bytes())
            return
        url = server.url.replace("http://", "ws://") + PATHS["tts"]
        with Bystander(url, {"Authorization": f"Bearer {CALM_KEY}"}) as bystander:
            target = Target(server, bystander, headers, 0)
            for protocol in PATHS:  # warm every path before the baseline
                asyncio.run(exchange(target, protocol, [as_frame({"type": "ping"})]))
            target.rss_before = server.rss_bytes()
            yield target


@pytest.fixture(scope="module")
def keyed() -> Iterator[Target]:
    """Two keys (the fuzzer's, the bystander's) and a stand-in LLM for bridge turns. After all
    the module's fuzzing: every fuzzed session has ended and the server's memory is back within
    `RSS_BOUND` of what it was before."""
    with EchoLLM() as llm:
        env = {"API_KEYS": f"{FUZZ_KEY},{CALM_KEY}", "LLM_URL": llm.url, "MAX_SESSIONS_PER_CLIENT": "100"}
        with _start(env, calm=True) as target:
            yield target
            admin = target.server.admin_headers()
            assert wait_for(lambda: metric(target.server, "voxgate_ws_sessions", admin) == 1, timeout=60), "left"
            grown = target.server.rss_bytes() - target.rss_before
            assert grown < RSS_BOUND, f"the server grew by {grown / (1 << 20):.1f} MiB"


@pytest.fixture(scope="module")
def bare() -> Iterator[Target]:
    """No keys (clients are told apart by address) and no LLM: a `user` turn is a typed error."""
    with _start({"MAX_SESSIONS_PER_CLIENT": "100"}, calm=False) as target:
        yield target


@pytest.fixture
def target(keyed: Target) -> Iterator[Target]:
    """`keyed`, checked after the test: unharmed, and the bystander was served all along."""
    since = keyed.bystander.utterances if keyed.bystander else 0
    yield keyed
    keyed.assert_unharmed(allowed=(UVICORN_UTF8,))  # that one: test_invalid_utf8_is_logged_without_a_traceback
    if keyed.bystander is not None:
        keyed.bystander.check(since)


# ---------------------------------------------------------------------- message sequences


OUT_OF_ORDER = [  # always among the examples: text before session.start, after session.end, cancel with nothing open
    scripted(
        {"type": "text.delta", "text": "early "}, {"type": "text.end"}, {"type": "cancel"}, {"type": "session.end"}
    ),
    scripted(
        {"type": "session.start"},
        {"type": "text.delta", "text": "one two "},
        {"type": "session.end"},
        {"type": "text.delta", "text": "late "},
        {"type": "cancel"},
        {"type": "session.start"},
    ),
    scripted(
        {"type": "session.start"}, {"type": "cancel"}, {"type": "cancel"}, {"type": "text.end"}, {"type": "text.end"}
    ),
    scripted(
        {
            "type": "session.start",
            "resume": {"session_id": "0" * 32, "resume_token": "x", "last_unit_index_received": 0},
        },
        {"type": "text.delta", "text": "after a refused resume "},
    ),
]


# vLLM-Omni's path: an utterance with nothing to voice ends at once (its session.done may come before
# the sentinel's pong; the socket stays open for the next utterance)
EMPTY_UTTERANCE = scripted({"type": "session.config"}, {"type": "input.done"})


@pytest.mark.parametrize("protocol", ["tts", "omni"])
def test_the_tts_sockets_keep_their_protocol_under_any_message_sequence(target, protocol):
    budget = Budget(40)

    @fuzz_settings(examples=120)
    @given(sent=sequences(protocol))
    @example(sent=EMPTY_UTTERANCE)
    @example(sent=OUT_OF_ORDER[0])
    @example(sent=OUT_OF_ORDER[1])
    @example(sent=OUT_OF_ORDER[2])
    @example(sent=OUT_OF_ORDER[3])
    @budget.each
    def run(sent: list[Frame]) -> None:
        fuzz(target, protocol, sent)

    run()
    budget.report()


def test_a_cancel_or_text_end_after_session_end_leaves_session_done_last(target):
    """Sent at once after session.end, they come before the writer has sent session.done: the
    cancel removed it (the client never got it), the text.end logged an utterance.done after
    it. Now both are refused (or, if they come after the close, dropped)."""
    for late in ("cancel", "text.end"):
        for _ in range(5):
            transcript = fuzz(
                target, "tts", scripted({"type": "session.start"}, {"type": "session.end"}, {"type": late})
            )
            assert transcript.messages[-1]["type"] == "session.done" and transcript.close_code == 1000
            assert all(e["code"] == "utterance_ending" for e in transcript.errors())  # unless it came after the close


BRIDGE_OUT_OF_ORDER = [
    scripted({"type": "cancel"}, {"type": "history"}, {"type": "reset"}, {"type": "cancel", "played_ms": 0}),
    scripted(
        {"type": "user", "content": "hello there"},
        {"type": "user", "content": "barge in"},
        {"type": "cancel"},
        {"type": "cancel"},
        {"type": "history"},
    ),
    scripted({"type": "config", "voice": "nobody"}, {"type": "user", "content": "still the old voice"}),
]


def test_the_bridge_socket_keeps_its_protocol_under_any_message_sequence(target):
    budget = Budget(40)

    @fuzz_settings(examples=120)
    @given(sent=sequences("bridge"))
    @example(sent=BRIDGE_OUT_OF_ORDER[0])
    @example(sent=BRIDGE_OUT_OF_ORDER[1])
    @example(sent=BRIDGE_OUT_OF_ORDER[2])
    @budget.each
    def run(sent: list[Frame]) -> None:
        fuzz(target, "bridge", sent)

    run()
    budget.report()


def test_an_llm_answer_no_model_should_write_is_spoken_cleaned(target):
    """A lone surrogate or control characters from the LLM are spoken as spaces (they failed the
    engine with a traceback before `LLMClient.stream` cleaned each delta)."""
    transcript = fuzz(target, "bridge", scripted({"type": "user", "content": "~ write junk"}, {"type": "history"}))
    assert transcript.of("done")[-1]["status"] == "completed"


@pytest.mark.parametrize("protocol", ["tts", "bridge"])
def test_without_keys_or_an_llm_every_message_is_served_or_refused_in_type(bare, protocol):
    budget = Budget(15)

    @fuzz_settings(examples=40)
    @given(sent=sequences(protocol))
    @example(sent=scripted({"type": "user", "content": "is anyone there"}))
    @budget.each
    def run(sent: list[Frame]) -> None:
        transcript = fuzz(bare, protocol, sent)
        assert not transcript.of("reply.start") or protocol != "bridge", "a reply with no LLM"

    run()
    budget.report()
    bare.assert_unharmed()


# ---------------------------------------------------------------------- invalid UTF-8


BAD_UTF8 = [b"\xff", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80"]


@st.composite
def invalid_utf8(draw: st.DrawFn, protocol: str) -> Frame:
    """A valid message's UTF-8 with invalid bytes (an overlong form, an encoded surrogate, a cut
    or impossible sequence) spliced in, sent as a text frame, whole or in fragments."""
    raw = json.dumps(draw(MESSAGES[protocol]), ensure_ascii=False).encode("utf-8", "surrogatepass")
    at = draw(st.integers(0, len(raw)))
    return Frame(raw[:at] + draw(st.sampled_from(BAD_UTF8)) + raw[at:], fragments=draw(st.integers(1, 3)))


@pytest.mark.parametrize("protocol", list(PATHS))
def test_invalid_utf8_in_a_text_frame_closes_the_socket_with_1007(target, protocol):
    budget = Budget(10)

    @fuzz_settings(examples=15)
    @given(opening=st.lists(frames(MESSAGES[protocol]), max_size=3), bad=invalid_utf8(protocol))
    @budget.each
    def run(opening: list[Frame], bad: Frame) -> None:
        transcript = fuzz(target, protocol, [*opening, bad])
        if transcript.close_code != 1008:  # unless the opening frames closed it first (a fatal error)
            assert transcript.close_code == 1007, transcript.messages[-3:]

    run()
    budget.report()


def test_invalid_utf8_is_logged_without_a_traceback(target):
    """uvicorn logs the client's bad frame with a traceback; `quiet_client_faults` makes it one line."""
    asyncio.run(exchange(target, "tts", [Frame(b'{"type": "ping", "id": "\xff"}')]))
    target.assert_unharmed()


# ---------------------------------------------------------------------- huge and deeply nested JSON


def _sized(size: int, char: str, shape: str) -> str:
    """JSON of exactly `size` bytes (UTF-8): a ping id, a delta's text or an array of `char`."""
    head, tail = {"ping": ('{"type": "ping", "id": "', '"}'), "text": ('{"type": "text.delta", "text": "', '"}'),
                  "array": ('["', '"]')}[shape]  # fmt: skip
    room = size - len(head) - len(tail)
    fill = char * (room // len(char.encode())) if room > 0 else ""
    return head + fill + "x" * (room - len(fill.encode())) + tail


SIZES = st.one_of(
    st.sampled_from([MAX_MESSAGE - 1, MAX_MESSAGE, MAX_MESSAGE + 1, FRAME_LIMIT, FRAME_LIMIT + 1, 4 * MAX_MESSAGE]),
    st.integers(MAX_MESSAGE - 200, FRAME_LIMIT + 200),
)


@pytest.mark.parametrize("protocol", list(PATHS))
def test_huge_json_is_refused_in_type_and_past_the_frame_limit_by_the_protocol(target, protocol):
    """Up to the message limit: parsed (and refused for what it says); up to the frame limit
    above it: `message_too_large`, the socket goes on; past that: closed with 1009."""

    budget = Budget(10)

    @fuzz_settings(examples=15)
    @given(size=SIZES, char=st.sampled_from(["x", "é", "中", "😀"]), shape=st.sampled_from(["ping", "text", "array"]),
           in_session=st.booleans())  # fmt: skip
    @budget.each
    def run(size: int, char: str, shape: str, in_session: bool) -> None:
        raw = _sized(size, char, shape)
        assert len(raw.encode()) == size
        opening = [START] if in_session and protocol != "bridge" else []
        transcript = fuzz(target, protocol, [*opening, Frame(raw)])
        too_large = [e for e in transcript.errors() if e["code"] == "message_too_large"]
        if size > FRAME_LIMIT:
            assert transcript.close_code == 1009
        else:
            assert transcript.of("pong") and bool(too_large) == (size > MAX_MESSAGE)  # and the socket went on

    run()
    budget.report()


def _nested(depth: int, kind: str) -> str:
    """A message `depth` levels deep (as deep as the server's JSON parser may just reach), with a
    UTF-16 escape that makes the server look for lone surrogates through all of it."""
    if kind == "list":
        return '{"type": "ping", "x": "\\ud83d\\ude00", "id": ' + "[" * depth + "]" * depth + "}"
    return '{"type": "ping", "id": ' + '{"a": ' * depth + '"\\udc00"' + "}" * depth + "}"


NESTED = [_nested(depth, kind) for depth in range(850, 1051) for kind in ("list", "dict")]
NESTED += ["[" * 60_000, "[" * 30_000 + "]" * 30_000, '{"type": ' + "[" * 30_000]  # within the limit, too deep


@pytest.mark.parametrize("protocol", list(PATHS))
def test_deeply_nested_json_is_an_invalid_message_at_every_depth(target, protocol):
    """Every depth around the parser's recursion limit, one frame each: each is one non-fatal
    error and the socket goes on; 100,000 levels (past the frame limit) closes it with 1009."""
    transcript = fuzz(target, protocol, [Frame(raw) for raw in NESTED])
    assert [e["fatal"] for e in transcript.errors()] == [False] * len(NESTED)
    assert transcript.of("pong"), "the socket did not go on"
    assert fuzz(target, protocol, [Frame("[" * 100_000)]).close_code == 1009


# ---------------------------------------------------------------------- floods


FLOODS = {  # (protocol, what is flooded, opening frames)
    "tts-ping": ("tts", {"type": "ping", "id": "p" * 200}, []),
    "tts-cancel": ("tts", {"type": "cancel"}, [START]),
    "tts-delta": ("tts", {"type": "text.delta", "text": "flooded words "}, [START]),
    "tts-flush": ("tts", {"type": "text.flush"}, [START]),
    "tts-end": ("tts", {"type": "text.end"}, [START, as_frame({"type": "text.delta", "text": "a b c d e f g h"})]),
    "tts-start": ("tts", {"type": "session.start"}, [START]),
    "tts-unknown": ("tts", {"type": "no.such.type"}, []),
    "tts-not-json": ("tts", "{not json", [START]),
    "tts-binary": ("tts", b"\x00" * 64, [START]),
    "omni-text": ("omni", {"type": "input.text", "text": "flooded words "}, [as_frame({"type": "session.config"})]),
    "omni-ping": ("omni", {"type": "ping", "id": 1}, [as_frame({"type": "session.config"})]),
    "bridge-ping": ("bridge", {"type": "ping", "id": 1}, []),
    "bridge-history": ("bridge", {"type": "history"}, [as_frame({"type": "user", "content": "remember this"})]),
    "bridge-cancel": ("bridge", {"type": "cancel"}, []),
    "bridge-config": ("bridge", {"type": "config", "system": "s" * 1000}, []),
    "bridge-binary": ("bridge", b"\x01" * 64, []),
}


def _flood_frame(flooded: dict | str | bytes) -> Frame:
    if isinstance(flooded, bytes):
        return Frame(flooded, text=False)
    return Frame(flooded) if isinstance(flooded, str) else as_frame(flooded)


@pytest.mark.parametrize("name", list(FLOODS))
def test_a_flood_of_any_message_is_rate_limited_then_closed(target, name):
    """FLOOD messages of one kind as fast as the socket takes them: served in protocol until
    the burst is spent, then `rate_limited` (fatal) and a 1008 close; nobody else notices."""
    protocol, flooded, opening = FLOODS[name]
    transcript = fuzz(target, protocol, [*opening, *[_flood_frame(flooded)] * FLOOD])
    assert [e["code"] for e in transcript.errors(fatal=True)] == ["rate_limited"]
    assert transcript.close_code == 1008


def test_a_flood_of_user_turns_interrupts_each_reply_and_every_reply_ends(target):
    """Turns below the rate limit, each barging into the last: every reply started is done."""
    transcript = fuzz(
        target, "bridge", scripted(*[{"type": "user", "content": f"turn {n} says hello"} for n in range(150)])
    )
    assert len(transcript.of("done")) == len(transcript.of("reply.start")) > 0
    assert not transcript.errors()


# ---------------------------------------------------------------------- resume


async def _dropped_session(target: Target) -> tuple[dict, float]:
    """A session of the fuzzer's that spoke units 0..5, then lost its connection (aborted);
    and when (time.monotonic())."""
    async with websockets.connect(target.url("tts"), additional_headers=target.headers) as ws:
        await ws.send(json.dumps({"type": "session.start", "max_pending_units": 2}))
        started = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "text.delta", "text": "one two three four five six."}))
        covered = -1
        while covered < 5:
            message = await ws.recv()
            if isinstance(message, str) and json.loads(message)["type"] == "units.done":
                covered = json.loads(message)["unit_end"]
        ws.transport.abort()
    return started, time.monotonic()


@pytest.mark.parametrize("whose", ["own", "own-wrong-token", "bystander", "unknown"])
def test_a_resume_is_granted_only_to_the_owner_with_its_token(target, whose):
    """A dropped session of the fuzzer's key is resumed with its token from any unit it had
    (and replayed from there); with a wrong token, for an unknown session or for the
    bystander's session (another key's, even with its real token) it is `resume_not_available`,
    and the bystander goes on undisturbed (checked after the test). Then any messages."""

    budget = Budget(15)

    @fuzz_settings(examples=8)
    @given(last=st.integers(-1, 7), then=st.lists(frames(TTS_MESSAGES), max_size=4))
    @budget.each
    def run(last: int, then: list[Frame]) -> None:
        own, dropped_at = asyncio.run(_dropped_session(target))
        theirs = target.bystander.started if target.bystander else {}
        unknown = {"session_id": secrets.token_hex(16), "resume_token": secrets.token_urlsafe(24)}
        session = {"own": own, "own-wrong-token": {**own, "resume_token": "wrong"}, "bystander": theirs,
                   "unknown": unknown}[whose]  # fmt: skip
        resume = {"session_id": session["session_id"], "resume_token": session["resume_token"],
                  "last_unit_index_received": last}  # fmt: skip
        transcript = fuzz(target, "tts", [as_frame({"type": "session.start", "resume": resume}), *then])
        answer = transcript.messages[0]
        if whose == "own" and answer["type"] == "error" and time.monotonic() - dropped_at > RESUME_WINDOW_S:
            reject()  # this machine was too busy to resume within the window: no conclusion
        if whose == "own" and last <= 5:
            assert answer["type"] == "session.started" and answer["resumed"] and answer["next_unit_index"] == 6
            replayed = [m for m in transcript.of("units.done") if m["unit_start"] <= 5]  # not the new text's
            covered = {u for m in replayed for u in range(m["unit_start"], m["unit_end"] + 1)}
            ended = {u for m in transcript.of("utterance.done") for u in range(m["unit_end"] + 1)}  # a cancel's
            assert covered | ended >= set(range(last + 1, 6)) and all(m["unit_end"] > last for m in replayed)
        else:
            assert answer["type"] == "error" and answer["code"] == "resume_not_available", answer

    run()
    budget.report()
