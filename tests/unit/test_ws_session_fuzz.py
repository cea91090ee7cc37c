"""The WebSocket session state machine under any interleaving of its three drivers: the
client's messages (the reader), the engine's progress (the synthesiser) and the writer's
sends, each a step of its own, as the asyncio tasks of voxgate/serving/ws.py may interleave
them. What the writer sends must keep the protocol: session.done once and last, and every
unit accounted for (the checks the socket fuzzers apply to a real server's output)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.socket_check import Transcript
from voxgate.serving.session import Segment, Session
from voxgate.serving.wsproto import ProtocolError, SessionStart, TextDelta

WORDS = st.lists(st.sampled_from(["one", "two.", "three", "四", "five!", " ", "\n"]), min_size=1, max_size=5)
STEPS = st.lists(
    st.one_of(
        WORDS.map(lambda words: ("delta", " ".join(words) + " ")),
        st.sampled_from(["flush", "end", "cancel", "finish", "take", "chunk", "done", "send", "send"]),
    ),
    max_size=40,
)
REFUSALS = {"utterance_ending", "text_queue_full"}


class Drivers:
    """The reader, the synthesiser and the writer of one session, a step at a time."""

    def __init__(self) -> None:
        self.session = Session("s1", SessionStart(type="session.start", max_pending_units=3), 24000)
        self.segment: Segment | None = None
        self.sent = Transcript("tts")

    def step(self, step: str | tuple[str, str]) -> None:
        s = self.session
        if isinstance(step, tuple):
            self.client(lambda: s.delta(TextDelta(type="text.delta", text=step[1])))
        elif step in ("flush", "end", "cancel", "finish"):
            self.client(getattr(s, step))
        elif step == "take" and self.segment is None:
            self.segment = s.take_segment()
        elif step == "chunk" and self.segment is not None:
            s.audio(self.segment, b"\x00\x01" * 8, 8)  # a no-op once its utterance was cancelled
        elif step == "done" and self.segment is not None:
            s.segment_done(self.segment)
            self.segment = None
        elif step == "send" and (entry := s.unsent()) is not None:
            self.sent.take(json.dumps(entry.message))
            if entry.payload is not None:
                self.sent.take(entry.payload)
            s.mark_sent()

    @staticmethod
    def client(message) -> None:
        try:
            message()
        except ProtocolError as exc:
            assert exc.code in REFUSALS, exc.code

    def run_out(self) -> None:
        """The client ends the session; the engine and the writer finish their work."""
        for step in ["cancel", "finish", *["done", "take", "chunk", "done"] * 100]:
            self.step(step)
        while self.session.unsent() is not None:
            self.step("send")


@settings(max_examples=600, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(steps=STEPS)
def test_any_interleaving_sends_session_done_once_and_last_with_every_unit_accounted(steps):
    drivers = Drivers()
    for step in steps:
        drivers.step(step)
    drivers.run_out()
    sent = drivers.sent
    assert [m["type"] for m in sent.messages].count("session.done") == 1, sent.messages
    assert sent.messages[-1]["type"] == "session.done", sent.messages[-3:]
    sent.check_units()
    assert not sent.problems, sent.problems
