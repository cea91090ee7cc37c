"""Exact accounting of a `voxgate load` run: a ledger per session, then the report.

The ledger is fed the events one session sees (units sent, audio headers, `units.done`,
`utterance.done`, errors, disconnects) and does no I/O, so every rule is unit-tested.
Per unit index: received = covered by `units.done` exactly once; duplicate = more than once;
cancelled = in a cancelled utterance and not received; missing = sent and none of these.
Mismatches are messages that contradict what was sent: ranges over units never sent or in
another utterance, audio `seq` that skips or goes back, a binary frame of the wrong size.
Two seq jumps are by design: a resume replays, with their original `seq`, the segments this
client discarded (those ending after its last `units.done`); a cancel drops its utterance's
unsent audio, seq numbers included, so the next utterance may start past a hole.

Each session also has a listener: it plays an utterance's audio at real time from its first
audio. An **underrun** is silence the server caused: the listener's buffer ran dry while the
whole text of the audio that came next (its segment, up to `unit_end`) had already been sent.
It lasts from the later of the two (buffer empty, text sent) to that audio's arrival. Silence
while the client had not yet sent the text is the client's pace, not an underrun; but once the
text is there, the wait for its audio counts even where the listener had run dry before it came
(the segment's first audio after a starved listener): such underruns are also counted apart
(`after_text_wait`), with how long the listener had waited for the text, since they can only be
as short as the server's first-audio latency, never zero.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from voxgate.bench.stats import summary

MAX_MISMATCH_NOTES = 20
DRIFT_WINDOW_S = 10.0
BACKPRESSURE_CODES = frozenset({"backpressure", "backpressure_drop"})
RESUME_CODES = frozenset({"resume_not_available"})


@dataclass(slots=True)
class _OpenSegment:
    """Audio of a segment whose `units.done` has not arrived (yet, or ever: a cancelled one)."""

    seqs: list[int] = field(default_factory=list)
    samples: int = 0


@dataclass(frozen=True, slots=True)
class UnitTally:
    sent: int
    received: int
    missing: int
    duplicate: int
    cancelled: int
    mismatched: int


@dataclass(frozen=True, slots=True)
class Underrun:
    """One moment a listener's buffer ran dry by the server's doing."""

    seconds: float  # how long the listener heard nothing
    ended_at: float  # when the audio that ended it arrived (the client's clock)
    after_first_audio: float  # that, from its utterance's first audio
    utterance: int
    seq: int  # the audio message that ended it
    text_wait: float = 0.0  # how long the listener had been dry before that audio's text was sent (0: it was)


class SessionLedger:
    """What one session sent and received, by unit index. Times are seconds since the run began."""

    def __init__(self) -> None:
        self.sent_at: list[float] = []
        self.done_hits: Counter[int] = Counter()
        self.first_audio_at: dict[int, float] = {}
        self.utterance_first: list[int] = [0]  # first unit of each utterance, as this client opened them
        self.utterance_first_audio: dict[int, float] = {}
        self.utterance_first_end: dict[int, int] = {}  # last unit of the first segment heard
        self.utterance_status: dict[int, tuple[str, int]] = {}
        self.cancel_requested: set[int] = set()
        self.open_segments: dict[tuple[int, int, int], _OpenSegment] = {}
        self.next_seq = 0
        # After a disconnect, a segment not done before it may come voiced again (stopped while
        # nobody listened), with new `seq` numbers (docs/protocol.md): its first audio may skip.
        # Only such a segment: its units were sent before the drop (no text goes to a dropped
        # session) and not done by then; a skip anywhere else is still a loss.
        self.revoicable_units = range(0)  # units of segments that may come voiced again
        self.heard_since_resume: set[tuple[int, int, int]] = set()
        self.last_audio_utterance = -1
        self.last_done_unit = -1
        self.mismatches = 0
        self.notes: list[str] = []
        self.errors_injected: Counter[str] = Counter()
        self.errors_other: Counter[str] = Counter()
        self.injected: set[str] = set()  # fault kinds already injected in this session
        self.resumes_attempted = self.resumes_succeeded = 0
        self.sample_rate = 0
        self.kept_samples = self.discarded_samples = self.bytes = 0
        self.repeated_messages = 0
        self.finished = False  # session.done arrived
        self.failure: str | None = None
        self.play_end: dict[int, float] = {}  # per utterance: when the listener's buffer runs dry
        self.underruns: list[float] = []  # seconds of each underrun
        self.underrun_events: list[Underrun] = []  # the same, with where each one fell

    # ---------------------------------------------------------------- events

    def sent(self, index: int, t: float) -> None:
        """Unit `index` went out; a resend keeps the first send time."""
        if index > len(self.sent_at):
            raise ValueError(f"unit {index} sent before unit {len(self.sent_at)}")
        if index == len(self.sent_at):
            self.sent_at.append(t)

    def audio(self, header: Mapping[str, Any], nbytes: int, t: float) -> None:
        """An `audio` header and the size of the binary frame that followed it."""
        seq, utt, start, end = (int(header[k]) for k in ("seq", "utterance", "unit_start", "unit_end"))
        self.bytes += nbytes
        key = (utt, start, end)
        revoiced = end in self.revoicable_units and key not in self.heard_since_resume
        self.heard_since_resume.add(key)
        self._check_seq(seq, utt, skip_ok=revoiced)
        if int(header.get("bytes", nbytes)) != nbytes:
            self.mismatch(f"audio seq {seq}: header says {header['bytes']} bytes, frame has {nbytes}")
        if not self._range_ok("audio", utt, start, end):
            return
        self._listen(utt, seq, end, int(header.get("samples", 0)), t)
        for i in range(start, end + 1):
            self.first_audio_at.setdefault(i, t)
        self.utterance_first_audio.setdefault(utt, t)
        self.utterance_first_end.setdefault(utt, end)
        segment = self.open_segments.setdefault((utt, start, end), _OpenSegment())
        segment.seqs.append(seq)
        segment.samples += int(header.get("samples", 0))

    def _listen(self, utt: int, seq: int, unit_end: int, samples: int, t: float) -> None:
        seconds = samples / self.sample_rate if self.sample_rate else 0.0
        dry = self.play_end.get(utt)
        if dry is not None:
            silent_from = max(dry, self.sent_at[unit_end])
            if t > silent_from:
                self.underruns.append(t - silent_from)
                first = self.utterance_first_audio.get(utt, t)
                text_wait = max(0.0, self.sent_at[unit_end] - dry)
                self.underrun_events.append(Underrun(t - silent_from, t, t - first, utt, seq, text_wait))
        self.play_end[utt] = max(dry if dry is not None else t, t) + seconds

    def units_done(self, utt: int, start: int, end: int) -> None:
        """`units.done`: units start..end (inclusive) are spoken."""
        if not self._range_ok("units.done", utt, start, end):
            return
        self.done_hits.update(range(start, end + 1))
        self.last_done_unit = max(self.last_done_unit, end)
        segment = self.open_segments.pop((utt, start, end), None)
        if segment is not None:
            self.kept_samples += segment.samples

    def utterance_done(self, utt: int, status: str, unit_end: int) -> None:
        """`utterance.done`; its status must be `cancelled` exactly when this client cancelled it."""
        if utt in self.utterance_status:
            if self.utterance_status[utt] == (status, unit_end):
                self.repeated_messages += 1
            else:
                self.mismatch(f"utterance {utt} done twice: {self.utterance_status[utt]} then {(status, unit_end)}")
            return
        if not 0 <= utt < len(self.utterance_first):
            self.mismatch(f"utterance.done for utterance {utt}, which was never started")
            return
        expected = "cancelled" if utt in self.cancel_requested else "completed"
        if status != expected:
            self.mismatch(f"utterance {utt} ended {status!r}, expected {expected!r}")
        self.utterance_status[utt] = (status, unit_end)

    def utterance_opened(self, first_unit: int) -> None:
        """The previous utterance ended (`utterance.done` came); the next starts at `first_unit`."""
        self.utterance_first.append(first_unit)

    def cancel_sent(self, next_unit: int) -> None:
        """`cancel` is going out: the current utterance ends, the next starts at `next_unit`."""
        self.cancel_requested.add(self.current_utterance)
        self.utterance_first.append(next_unit)

    def cancel_unsent(self) -> None:
        """The `cancel` never left (the socket was already gone): undo `cancel_sent`."""
        self.utterance_first.pop()
        self.cancel_requested.discard(self.current_utterance)

    def disconnected(self) -> int:
        """The socket is gone: drop audio of segments without `units.done` (the server replays them
        with their original `seq`); returns the unit to resume from (`last_unit_index_received`)."""
        replayed = [key for key in self.open_segments if key[2] > self.last_done_unit]
        self.revoicable_units = range(self.last_done_unit + 1, len(self.sent_at))
        self.heard_since_resume = set()
        if replayed:
            self.next_seq = min(min(self.open_segments[key].seqs) for key in replayed)
            self.last_audio_utterance = min(key[0] for key in replayed)
            for key in replayed:
                self.discarded_samples += self.open_segments.pop(key).samples
        return self.last_done_unit

    def error(self, code: str) -> None:
        """An `error` message, or a client-side failure (codes starting `client_`)."""
        injected = (code in BACKPRESSURE_CODES and "backpressure" in self.injected) or (
            code in RESUME_CODES and self.resumes_attempted > 0
        )
        (self.errors_injected if injected else self.errors_other)[code] += 1

    def mismatch(self, note: str) -> None:
        self.mismatches += 1
        if len(self.notes) < MAX_MISMATCH_NOTES:
            self.notes.append(note)

    def _check_seq(self, seq: int, utt: int, skip_ok: bool = False) -> None:
        hole_by_cancel = any(self.last_audio_utterance <= u < utt for u in self.cancel_requested)
        if seq < self.next_seq or (seq > self.next_seq and not hole_by_cancel and not skip_ok):
            self.mismatch(f"audio seq {seq}, expected {self.next_seq}")
        self.next_seq = max(self.next_seq, seq + 1)
        self.last_audio_utterance = utt

    def _range_ok(self, what: str, utt: int, start: int, end: int) -> bool:
        if not 0 <= start <= end < len(self.sent_at):
            self.mismatch(f"{what} covers units {start}..{end}; units sent: 0..{len(self.sent_at) - 1}")
            return False
        if not 0 <= utt < len(self.utterance_first):
            self.mismatch(f"{what} for utterance {utt}, which was never started")
            return False
        first = self.utterance_first[utt]
        after = self.utterance_first[utt + 1] if utt + 1 < len(self.utterance_first) else len(self.sent_at)
        if not first <= start <= end < after:
            self.mismatch(f"{what} covers units {start}..{end}, outside utterance {utt} ({first}..{after - 1})")
            return False
        return True

    # ---------------------------------------------------------------- reading

    @property
    def current_utterance(self) -> int:
        return len(self.utterance_first) - 1

    @property
    def clean(self) -> bool:
        return self.finished and self.failure is None

    def cancelled_units(self) -> set[int]:
        """Units of cancelled utterances (up to the server's `unit_end`) that were not spoken."""
        out: set[int] = set()
        for utt, (status, unit_end) in self.utterance_status.items():
            if status == "cancelled":
                out.update(i for i in range(self.utterance_first[utt], unit_end + 1) if i not in self.done_hits)
        return out

    def tally(self) -> UnitTally:
        sent = len(self.sent_at)
        received = sum(1 for i, n in self.done_hits.items() if n == 1)
        duplicate = sum(1 for n in self.done_hits.values() if n > 1)
        cancelled = len(self.cancelled_units())
        missing = sent - received - duplicate - cancelled
        return UnitTally(sent, received, missing, duplicate, cancelled, self.mismatches)

    def unit_latencies(self) -> list[tuple[float, float]]:
        """(send time, seconds to the first audio covering the unit) per unit that got audio."""
        return [(self.sent_at[i], t - self.sent_at[i]) for i, t in sorted(self.first_audio_at.items())]

    def ttfas(self) -> list[tuple[float, float]]:
        """(send time of its first unit, seconds to its first audio) per utterance that got audio."""
        out = []
        for utt, t in sorted(self.utterance_first_audio.items()):
            first = self.utterance_first[utt]
            out.append((self.sent_at[first], t - self.sent_at[first]))
        return out

    def gateway_ttfas(self) -> list[tuple[float, float]]:
        """(send time, seconds) from the unit that completed an utterance's first segment (when
        the gateway could start speaking it) to its first audio: TTFA less the wait for text."""
        out = []
        for utt, t in sorted(self.utterance_first_audio.items()):
            ready = self.sent_at[self.utterance_first_end[utt]]
            out.append((ready, t - ready))
        return out

    @property
    def audio_s(self) -> float:
        kept = self.kept_samples + sum(s.samples for s in self.open_segments.values())
        return kept / self.sample_rate if self.sample_rate else 0.0


# ---------------------------------------------------------------------------- report


def windowed_ms(samples: Sequence[tuple[float, float]], span_s: float, window_s: float) -> dict[str, Any]:
    """Summaries in ms of all samples, of those sent in the first `window_s` and in the last."""
    return {
        "all": summary([1000 * v for _, v in samples], digits=1),
        "first": summary([1000 * v for t, v in samples if t < window_s], digits=1),
        "last": summary([1000 * v for t, v in samples if t >= span_s - window_s], digits=1),
    }


def summarize(ledgers: Sequence[SessionLedger], sending_s: float) -> dict[str, Any]:
    """The results section of the report, from every session's ledger."""
    tallies = [ledger.tally() for ledger in ledgers]
    units = {f.name: sum(getattr(t, f.name) for t in tallies) for f in fields(UnitTally)}
    window = min(DRIFT_WINDOW_S, sending_s / 2)
    injected: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for ledger in ledgers:
        injected.update(ledger.errors_injected)
        other.update(ledger.errors_other)
    return {
        "sessions": len(ledgers),
        "sessions_ok": sum(ledger.clean for ledger in ledgers),
        "session_errors": sum(not ledger.clean for ledger in ledgers),
        "failures": dict(Counter(ledger.failure for ledger in ledgers if ledger.failure)),
        "units": units,
        "mismatch_notes": [note for ledger in ledgers for note in ledger.notes][:MAX_MISMATCH_NOTES],
        "resumes": {
            "attempted": sum(ledger.resumes_attempted for ledger in ledgers),
            "succeeded": sum(ledger.resumes_succeeded for ledger in ledgers),
        },
        "injected": dict(Counter(kind for ledger in ledgers for kind in ledger.injected)),
        "cancels": sum(len(ledger.cancel_requested) for ledger in ledgers),
        "backpressure_events": {
            "pauses": sum("backpressure" in ledger.injected for ledger in ledgers),
            "server_warnings": injected["backpressure"] + other["backpressure"],
            "drops": injected["backpressure_drop"] + other["backpressure_drop"],
        },
        "errors": {"injected": dict(injected), "other": dict(other)},
        "repeated_messages": sum(ledger.repeated_messages for ledger in ledgers),
        "audio_s": round(sum(ledger.audio_s for ledger in ledgers), 3),
        "audio_s_discarded": round(sum(ledger.discarded_samples / (ledger.sample_rate or 1) for ledger in ledgers), 3),
        "bytes": sum(ledger.bytes for ledger in ledgers),
        "drift_window_s": round(window, 3),
        "ttfa_ms": windowed_ms([s for ledger in ledgers for s in ledger.ttfas()], sending_s, window),
        "gateway_ttfa_ms": windowed_ms([s for ledger in ledgers for s in ledger.gateway_ttfas()], sending_s, window),
        "unit_latency_ms": windowed_ms([s for ledger in ledgers for s in ledger.unit_latencies()], sending_s, window),
        "unfaulted": _latencies([ledger for ledger in ledgers if not ledger.injected], sending_s, window),
        "underruns": underruns(ledgers),
    }


MAX_UNDERRUN_EVENTS = 200  # the report lists at most this many underruns one by one (the longest)


def underruns(ledgers: Sequence[SessionLedger]) -> dict[str, Any]:
    """Underruns (see the module's docstring) in all, and per session (count, ms); then the
    longest ones one by one (`events`), each with when it ended in seconds from the run's
    first audio (underruns of many sessions at one moment: a stall of the whole server), how
    long after its utterance's first audio (right after it: a new stream's second chunk came
    late), the audio message (`seq`) that ended it and how long the listener had already waited
    for that audio's text (`text_wait_ms`; 0: the text was there before the buffer ran dry)."""
    per = [(len(ledger.underruns), 1000 * sum(ledger.underruns)) for ledger in ledgers]
    starts = [t for ledger in ledgers for t in ledger.utterance_first_audio.values()]
    origin = min(starts, default=0.0)
    events = [(e, i) for i, ledger in enumerate(ledgers) for e in ledger.underrun_events]
    events.sort(key=lambda pair: -pair[0].seconds)
    waited = [e for e, _ in events if e.text_wait > 0]
    return {
        "count": sum(n for n, _ in per),
        "total_ms": round(sum(ms for _, ms in per), 1),
        "after_text_wait": {"count": len(waited), "total_ms": round(1000 * sum(e.seconds for e in waited), 1)},
        "sessions_with": sum(n > 0 for n, _ in per),
        "worst_session_ms": round(max((ms for _, ms in per), default=0.0), 1),
        "per_session": [{"count": n, "ms": round(ms, 1)} for n, ms in per],
        "events": [
            {
                "session": i,
                "ms": round(1000 * e.seconds, 1),
                "at_s": round(e.ended_at - origin, 3),
                "after_first_audio_ms": round(1000 * e.after_first_audio, 1),
                "utterance": e.utterance,
                "seq": e.seq,
                "text_wait_ms": round(1000 * e.text_wait, 1),
            }
            for e, i in sorted(events[:MAX_UNDERRUN_EVENTS], key=lambda pair: pair[0].ended_at)
        ],
    }


def _latencies(ledgers: Sequence[SessionLedger], sending_s: float, window: float) -> dict[str, Any]:
    """TTFA, gateway TTFA and UnitLatency of some sessions (e.g. those with no fault injected:
    what the faults cost everyone else)."""
    return {
        "sessions": len(ledgers),
        "ttfa_ms": windowed_ms([s for ledger in ledgers for s in ledger.ttfas()], sending_s, window),
        "gateway_ttfa_ms": windowed_ms([s for ledger in ledgers for s in ledger.gateway_ttfas()], sending_s, window),
        "unit_latency_ms": windowed_ms([s for ledger in ledgers for s in ledger.unit_latencies()], sending_s, window),
    }


def markdown_table(results: Mapping[str, Any]) -> str:
    """The run's summary as Markdown: counts, then TTFA and UnitLatency by window."""
    u, r, e, x = results["units"], results["resumes"], results["errors"], results["underruns"]
    lines = [
        "| sessions ok | units sent | received | missing | duplicate | mismatched | cancelled "
        "| resumes ok | errors injected | errors other | audio s | underruns (sessions, ms; after a text wait) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {results['sessions_ok']}/{results['sessions']} | {u['sent']} | {u['received']} | {u['missing']} "
        f"| {u['duplicate']} | {u['mismatched']} | {u['cancelled']} | {r['succeeded']}/{r['attempted']} "
        f"| {sum(e['injected'].values())} | {sum(e['other'].values())} | {results['audio_s']:.1f} "
        f"| {x['count']} ({x['sessions_with']}, {x['total_ms']}; {x['after_text_wait']['count']}) |",
        "",
        "| metric (ms) | window | n | p50 | p95 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    window = f"{results['drift_window_s']:g} s"
    for metric in ("ttfa_ms", "gateway_ttfa_ms", "unit_latency_ms"):
        for key, label in (("all", "whole run"), ("first", f"first {window}"), ("last", f"last {window}")):
            s = results[metric][key]
            lines.append(f"| {metric[:-3]} | {label} | {s['n']} | {s['p50']} | {s['p95']} | {s['p99']} |")
    server = results.get("server_first_audio") or {}
    first = server.get("utterance_first") or {}
    if first.get("segments"):
        stages = [k for k in first if k not in ("segments", "engine_split")]
        lines += ["", f"server, utterance's first segment ({first['segments']}) ms p50 / p95: "
                  + ", ".join(f"{k} {first[k]['p50']} / {first[k]['p95']}" for k in stages)]  # fmt: skip
        if split := first.get("engine_split"):
            lines.append("engine stage by the engine's clocks ms p50 / p95: "
                         + ", ".join(f"{k} {v['p50']} / {v['p95']}" for k, v in split.items()))  # fmt: skip
    elif "unavailable" in server:
        lines += ["", f"server stages: {server['unavailable']}"]
    return "\n".join(lines)
