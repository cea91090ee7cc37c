"""What the probe heard, cut into replies, and whether each reply was captured (pure).

A reply is found by its `reply.start` / `reply.end` events (matched by trace id, numbered
in order: the reply sequence); its post-transport audio is what arrived from `reply.start`
to `reply.end` + `END_PAD_S` (audio still on its way), never past the next reply's start.
Cutting the call into replies keeps the natural silence before a reply (the user speaking,
the agent thinking) out of the gap and dropout measures.

Capture status classes decide which metrics apply (see `metrics.py`):
OK (both sides have audio), POST_SILENT (the engine made audio, none arrived: transport),
PRE_MISSING (audio arrived, no engine capture: the server was not started with a capture
dir), BOTH_MISSING (no audio at all for a reply that was not cut), CUT_SILENT (a reply cut
before it had made a sound: nothing to measure, not a fault).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from voxgate.regress import signals
from voxgate.regress.e2e.call import AUDIBLE_RMS, END_PAD_S, CallRecording, unheard_replies

MIN_AUDIBLE_S = 0.1  # a side "has audio" with this much of 20 ms frames above AUDIBLE_RMS


class Capture(StrEnum):
    OK = "OK"
    POST_SILENT = "POST_SILENT"
    PRE_MISSING = "PRE_MISSING"
    BOTH_MISSING = "BOTH_MISSING"
    CUT_SILENT = "CUT_SILENT"


@dataclass(frozen=True, slots=True)
class ReplyTake:
    """One reply of one call: events, post-transport audio and the times around it."""

    case_id: str
    attempt: int
    reply_seq: int  # 1, 2, ... in the call
    trace_id: str
    status: str | None  # reply.end's status (completed, interrupted, failed, ...); None: never ended
    t_start: float  # reply.start arrival (bot clock)
    t_end: float | None
    t_eot: float | None  # the user's words that this reply answers ended (bot clock)
    t_first_audio: float | None  # first audible frame of the reply to arrive
    post: np.ndarray  # float32 mono at `rate`
    arrivals: np.ndarray  # arrival time of each received frame in the window
    rate: int

    @property
    def cut(self) -> bool:
        return self.status not in ("completed", "failed", None)


def audible_s(x: np.ndarray, rate: int) -> float:
    """Seconds of 20 ms frames louder than AUDIBLE_RMS."""
    return float(np.count_nonzero(signals.frame_rms(x, rate, 0.02) > AUDIBLE_RMS) * 0.02)


def _of(events: list[tuple[float, dict[str, Any]]], kind: str) -> list[tuple[float, dict[str, Any]]]:
    return [(t, e) for t, e in events if e.get("type") == kind]


def replies(rec: CallRecording) -> list[ReplyTake]:
    """The call's replies in order, each with its slice of the recording (none for a reply cut
    before any of its audio went out: nobody heard it)."""
    unheard = unheard_replies(rec.events)
    starts = [(t, e) for t, e in _of(rec.events, "reply.start") if e.get("trace_id") not in unheard]
    ends = {e.get("trace_id"): t for t, e in _of(rec.events, "reply.end")}
    statuses = {e.get("trace_id"): e.get("status") for _, e in _of(rec.events, "reply.end")}
    out = []
    for seq, (t_start, event) in enumerate(starts, 1):
        trace = str(event.get("trace_id"))
        t_end = ends.get(trace)
        stop = (t_end + END_PAD_S) if t_end is not None else float("inf")
        if seq < len(starts):
            stop = min(stop, starts[seq][0])
        window = [(t, x) for t, x in rec.audio if t_start <= t < stop]
        post = np.concatenate([x for _, x in window]).astype(np.float32) if window else np.zeros(0, np.float32)
        loud = [t for t, x in window if signals.rms(x) > AUDIBLE_RMS]
        eots = [s.t_eot for s in rec.said if s.t_eot <= t_start]
        out.append(ReplyTake(rec.case_id, rec.attempt, seq, trace, statuses.get(trace), t_start, t_end,
                             max(eots) if eots else None, loud[0] if loud else None, post,
                             np.array([t for t, _ in window]), rec.record_rate))  # fmt: skip
    return out


def capture_status(take: ReplyTake, pre: np.ndarray | None, pre_rate: int = 0) -> Capture:
    """The class of one reply's capture (`pre`: the engine's audio, None if not captured)."""
    post_ok = audible_s(take.post, take.rate) >= MIN_AUDIBLE_S
    pre_ok = pre is not None and audible_s(pre, pre_rate or take.rate) >= MIN_AUDIBLE_S
    if pre_ok and post_ok:
        return Capture.OK
    if pre_ok:
        return Capture.POST_SILENT
    if post_ok:
        return Capture.PRE_MISSING
    return Capture.CUT_SILENT if take.cut else Capture.BOTH_MISSING


def call_audible(rec: CallRecording) -> bool:
    """The seeds' validity rule: the agent was heard somewhere after the user first spoke
    (a reply slice can be empty when its events were late while the call had audio)."""
    since = rec.said[0].t_start if rec.said else rec.t0
    pieces = [x for t, x in rec.audio if t >= since]
    return bool(pieces) and audible_s(np.concatenate(pieces), rec.record_rate) >= MIN_AUDIBLE_S
