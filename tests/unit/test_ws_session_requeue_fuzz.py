"""`Session.requeue` (a segment stopped while nobody listened, voiced again whole) fuzzed with
drops, resumes, cancels and ends: a client that follows docs/protocol.md (it discards the audio of
segments without units.done at each disconnect) hears each completed segment's audio exactly once,
from one voicing, whole; the log's cursor and byte counts stay consistent at every step. The engine's
stop may be seen while still detached, or only after a resume (then the gateway drops the socket
that heard part of the segment, as ws.py does on `requeue`'s True)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.serving.session import Session
from voxgate.serving.wsproto import ProtocolError, SessionStart, TextDelta

WORDS = st.lists(st.sampled_from(["one", "two.", "three", "five!", " "]), min_size=1, max_size=4)
STEPS = st.lists(
    st.one_of(
        WORDS.map(lambda w: ("delta", " ".join(w) + " ")),
        st.sampled_from(
            [
                "flush",
                "end",
                "cancel",
                "finish",
                "take",
                "chunk",
                "chunk",
                "done",
                "send",
                "send",
                "send",
                "drop",
                "resume",
                "preempt",
                "observe",
            ]
        ),
    ),
    max_size=60,
)


class World:
    def __init__(self, late_observe: bool, replay=1 << 20):
        self.s = Session("s", SessionStart(type="session.start", max_pending_units=2), 24000, replay_bytes=replay)
        self.late = late_observe
        self.attached = True
        self.seg = None
        self.attempt = {}
        self.idx = 0
        self.preempt_pending = False
        self.last_unit = -1
        self.heard = {}  # (utt, unit_start) -> list of (attempt, idx)
        self.confirmed = set()
        self.gave_up = False
        self.completed = {}

    def inv(self):
        s = self.s
        assert 0 <= s._cursor <= len(s._log)
        assert s._log_bytes == sum(e.size for e in s._log)
        assert s._unsent_bytes == sum(e.size for e in s._log[s._cursor :])

    def step(self, st_):
        s = self.s
        if self.gave_up:
            return
        if isinstance(st_, tuple) or st_ in ("flush", "end", "cancel", "finish"):
            if not self.attached:
                return
            try:
                if isinstance(st_, tuple):
                    s.delta(TextDelta(type="text.delta", text=st_[1]))
                else:
                    getattr(s, st_)()
            except ProtocolError:
                pass
        elif st_ == "take" and self.seg is None:
            self.seg = s.take_segment()
            if self.seg is not None:
                k = (self.seg.utterance, self.seg.unit_start)
                self.attempt[k] = self.attempt.get(k, 0) + 1
                self.idx = 0
        elif st_ == "chunk" and self.seg is not None:
            k = (self.seg.utterance, self.seg.unit_start)
            s.audio(self.seg, f"{k[0]}:{k[1]}:{self.attempt[k]}:{self.idx}".encode(), 8)
            self.idx += 1
        elif st_ == "done" and self.seg is not None and not self.preempt_pending:
            k = (self.seg.utterance, self.seg.unit_start)
            if s.current(self.seg):
                self.completed[k] = (self.attempt[k], self.idx)
            s.segment_done(self.seg)
            self.seg = None
        elif st_ == "preempt" and self.seg is not None and not self.attached and not self.preempt_pending:
            self.preempt_pending = True  # the runner decided while nobody listened
            if not self.late:
                self.observe()
        elif st_ == "observe":
            self.observe()
        elif st_ == "send" and self.attached and (e := s.unsent()) is not None:
            m = e.message
            if m["type"] == "audio":
                u, us, att, i = map(int, e.payload.decode().split(":"))
                self.heard.setdefault((u, us), []).append((att, i))
            elif m["type"] in ("units.done", "utterance.done"):
                self.last_unit = max(self.last_unit, m["unit_end"])
                if m["type"] == "units.done":
                    self.confirmed.add((m["utterance"], m["unit_start"]))
            s.mark_sent()
        elif st_ == "drop" and self.attached:
            self.attached = False
            for k in list(self.heard):  # protocol: discard audio of segments without units.done
                if k not in self.confirmed:
                    del self.heard[k]
        elif st_ == "resume" and not self.attached:
            try:
                s.resume(self.last_unit)
            except ProtocolError:
                self.gave_up = True
                return
            self.attached = True
        self.inv()

    def observe(self):
        if self.preempt_pending:
            self.preempt_pending = False
            heard_part = self.s.requeue(self.seg)
            self.seg = None
            if heard_part and self.attached:  # the gateway drops that socket (ws.py): resume again
                self.step("drop")

    def run_out(self):
        if self.gave_up:
            return
        if not self.attached:
            self.step("resume")
        if self.gave_up:
            return
        self.observe()
        for x in ["done", "finish", *["take", "chunk", "chunk", "done"] * 60]:
            self.step(x)
        while self.s.unsent() is not None:
            self.step("send")

    def check(self):
        if self.gave_up:
            return
        for k in self.confirmed:
            got = self.heard.get(k, [])
            att, n = self.completed[k]
            assert got == [(att, i) for i in range(n)], (k, got, att, n)


def _run(steps, late):
    w = World(late)
    for x in steps:
        w.step(x)
    w.run_out()
    w.check()


@settings(
    max_examples=400, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(steps=STEPS)
def test_a_stop_seen_while_detached_leaves_each_segment_heard_once(steps):
    _run(steps, late=False)


@settings(
    max_examples=400, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(steps=STEPS)
def test_a_stop_seen_after_a_resume_leaves_each_segment_heard_once(steps):
    _run(steps, late=True)


def test_a_resume_between_the_engines_stop_and_the_requeue_hears_the_segment_once():
    steps = [("delta", "one two. "), "take", "chunk", "drop", "preempt", "resume", "send", "observe"]
    _run(steps, late=True)
