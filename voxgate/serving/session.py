"""One WebSocket TTS session as a pure state machine (no sockets, no engine, no clock).

The session takes the client's text (`delta`, `flush`, `end`, `cancel`, `finish`), cuts it
into segments for the engine (`take_segment`), and records everything it must send in an
ordered **log** (`audio`, `segment_done`): audio, `units.done`, `utterance.done`, errors.
The writer sends from a cursor into the log (`unsent`, `sending`, `mark_sent`: a cancel or a
requeue may remove the entry while its bytes are on the way); a resume moves the
cursor back to the first message the client lacks (`resume`). Sent entries are trimmed from
the front to a byte budget; what a resume needs is kept or the resume is refused.

Rules are in docs/protocol.md. A refused message raises `ProtocolError` and changes nothing.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from voxgate.bridge.cuts import abbreviation_holds
from voxgate.serving.wsproto import ProtocolError, SessionStart, TextDelta
from voxgate.text import check_characters, is_cjk_char, split_units
from voxgate.text import count_units as text_units
from voxgate.types import VoxgateError

_SENTENCE_END = re.compile(r"[.!?;:](?=\s|$)|[。！？；\n]")
_OPEN_END = ".:"  # at a delta's very end, not yet a sentence end: "3." + "50", "10:" + "30"
_CORE_CHARS = 48  # text before a full stop that decides an abbreviation (its word, and a bit more)
_CLAUSE_END = re.compile(r"[,—](?=\s)|[，、]")  # a comma cuts only with the space after it: "1," + "000"


def _word_boundary(before: str, after: str) -> bool:
    """Whether a segment may end between these characters ("" after: not known yet): at
    whitespace, or beside a CJK character. A delta may end inside a word ("1," then "000",
    "Hel" then "lo"), so a cut by length waits until the next delta shows where the word ends."""
    return before.isspace() or after[:1].isspace() or any(c and is_cjk_char(c) for c in (before, after))


def _cut_point(text: str, after: int) -> int:
    """Where a segment cut by a sentence or clause end that closes at `after` may fall in a
    delta: its end, unless words follow and the delta ends inside one (the next delta may go on
    with it, or it ends at a mark the next delta decides): then at the mark and the spaces after
    it, and the words after it open the next segment."""
    tail = text[after:]
    if not tail.strip() or _word_boundary(text[-1:], ""):
        return len(text)
    return after + len(tail) - len(tail.lstrip())


def _unit_pieces(text: str) -> list[str]:
    """`text` cut before each unit but its first: the whitespace after a unit stays with it
    (a sentence or clause end sees the space after its mark), the text before the first unit
    with that one."""
    starts = [unit.start for unit in split_units(text)[1:]]
    return [text[a:b] for a, b in zip([0, *starts], [*starts, len(text)], strict=True)]


def count_units(text: str, mode: str) -> int:
    """Units in `text`: `voxgate.text` units ("words": CJK characters and other words, as the
    engines and the load tool count them), or non-space characters ("chars")."""
    if mode == "chars":
        return sum(not c.isspace() for c in text)
    return text_units(text)


@dataclass(frozen=True, slots=True)
class Segment:
    """Text for one engine request: units `unit_start..unit_end` of utterance `utterance`."""

    utterance: int
    text: str
    unit_start: int
    unit_end: int
    queued_at: float = 0.0  # when it became speakable (the caller's clock)
    starter: bool = False  # the first segment of its utterance (a cached opener may voice it)
    again: bool = False  # voiced again after the engine stopped it (`Session.requeue`): its latency was recorded


@dataclass(slots=True)
class Entry:
    """One logged server message (and its audio bytes). `key` orders replay: a segment's
    messages carry its last unit; `utterance.done`/`session.done` sit half a unit later, so a
    client that has every unit up to n but missed the utterance's end gets that end again."""

    message: dict[str, Any]
    payload: bytes | None
    utterance: int
    key: float
    first: bool = False  # the first audio of its segment
    ready_at: float | None = None  # for a segment's first audio: when the segment was queued
    opens_utterance: bool = False  # the first audio of its utterance
    stamps: tuple[float, ...] = ()  # for a segment's first audio: the caller's clocks on its way (see `audio`)
    text: str | None = None  # a segment's first audio and its units.done: the segment's text
    marks: dict[str, float] | None = None  # for a segment's first audio: the engine's clocks (`AudioChunk.marks`)

    @property
    def size(self) -> int:
        return 64 + (len(self.payload) if self.payload else 0)


@dataclass
class Session:
    session_id: str
    config: SessionStart
    sample_rate: int
    replay_bytes: int = 512 << 10
    max_text_chars: int = 4096  # longest delta, and longest segment but for one delta's overshoot
    text_queue_chars: int = 16384  # received text not yet handed to the engine
    next_unit: int = 0  # the index the next delta must start at
    utterance: int = 0  # the open (or next) utterance
    open: bool = False  # an utterance has text, or an end, not yet done
    ending: bool = False  # text.end received for the open utterance
    finishing: bool = False  # session.end received
    done: bool = False  # session.done logged
    audio_samples: int = 0
    last_delta_at: float = 0.0
    _pending: list[str] = field(default_factory=list)
    _pending_chars: int = 0
    _pending_start: int = 0
    _queue: deque[Segment] = field(default_factory=deque)
    _queued_chars: int = 0  # text in _queue
    _segments_made: int = 0  # segments of the open utterance so far (the starter policy)
    _schedule_from: int = 0  # segments made when the size schedule last started (0, or a starved listener)
    # The last delta ended at a "." or ":" (and maybe spaces) the next delta decides: the text up to
    # the mark, and whether a space followed it ("3." + "50" goes on; "Dr. " + "Lee" holds).
    _open_core: str | None = None
    _open_spaced: bool = False
    _inflight: Segment | None = None
    _log: list[Entry] = field(default_factory=list)
    _cursor: int = 0  # index into _log of the next entry to send
    _unsent_bytes: int = 0
    _log_bytes: int = 0
    _trimmed_key: float = -1.0  # highest key among entries trimmed away
    _seq: int = 0
    _last_audio_of: Segment | None = None
    _audio_before: Segment | None = None  # what `_last_audio_of` was before its segment's first audio
    _sent_from: int = 0  # log index the current socket started sending from (0, or where a resume replays)
    _inflight_samples: int = 0  # audio logged for the segment in flight (`requeue` takes it back)
    _on_the_way: Entry | None = None  # the entry the writer is sending (`sending`), until `mark_sent`

    # ------------------------------------------------------------------ client text

    def delta(self, msg: TextDelta, now: float = 0.0) -> None:
        if self.finishing:
            raise ProtocolError("utterance_ending", "the session is ending (session.end was sent)")
        if self.ending:
            raise ProtocolError("utterance_ending", "text.end was sent; wait for utterance.done before more text")
        first = self.next_unit if msg.first_unit_index is None else msg.first_unit_index
        if first != self.next_unit:
            code, how = ("unit_gap", "skips units") if first > self.next_unit else ("unit_overlap", "repeats units")
            raise ProtocolError(code, f"first_unit_index {first} {how}; expected {self.next_unit}",
                                expected_unit_index=self.next_unit)  # fmt: skip
        text = self._admit(msg.text)
        units = count_units(text, self.config.units)
        self.open = True
        self.last_delta_at = now
        if units > self.config.max_pending_units and self.config.segments == "auto":
            # Taken a unit at a time, as if streamed so: sentence ends and the pending limit cut it
            # into segments, so none outgrows the limit (one segment of a whole long delta held
            # no units.done for longer than the replay buffer, and a dropped client could not resume).
            for piece in _unit_pieces(text):
                self._take(piece, count_units(piece, self.config.units), piece, now)
        else:
            self._take(text, units, msg.text, now)

    def _take(self, text: str, units: int, sent: str, now: float) -> None:
        """An admitted delta's `text` (`units` of them; `sent`: as the client sent it) joins
        the pending segment, cut where the segmentation policy says."""
        if self._pending_chars + len(text) > self.max_text_chars:
            self.flush(now)  # no segment grows past the text limit (HTTP's, for one request)
        elif self._full() and _word_boundary(self._pending[-1][-1], text[:1]) and self.config.segments == "auto":
            self.flush(now)  # full, and this delta starts a new word: the cut the last delta could not make
        carried = self._open_core is not None and not text.strip()
        if self._open_core is not None and not carried and self.config.segments == "auto" and self._open_end_cuts(text):
            self.flush(now)  # "Hello." then " How": the sentence end the last delta could not be sure of
        if not carried:
            self._open_core = None
        if self.config.segments == "utterance":
            self._add(text, units)
            return  # spoken whole at text.end (or text.flush): no cut of its own
        # A blank delta is kept as at most a space, so its line break is looked for in what was sent.
        ends, open_core = self._sentence_ends(text) if text.strip() else ([0] * ("\n" in sent), None)
        if self.config.starter_units > 0 and self._segments_made == self._schedule_from:
            ends += [m.end() for m in _CLAUSE_END.finditer(text)]  # a starter ends at its first clause
        if ends:  # cut at the delta's end, or before the word it ends inside ("Hi. The" + "re")
            at = _cut_point(text, max(ends))
            head, rest = text[:at], text[at:]
            rest_units = count_units(rest, self.config.units)
            if count_units(head, self.config.units) + rest_units != units:  # never number units otherwise
                head, rest, rest_units = text, "", 0
            self._add(head, units - rest_units)
            self.flush(now)
            self._add(rest, rest_units)
        else:
            self._add(text, units)
            if self._full() and _word_boundary(text[-1:], ""):
                self.flush(now)
        if open_core is not None:
            self._open_core, self._open_spaced = open_core, not text.endswith(open_core[-1:])
        elif carried and self._pending:
            self._open_spaced = True  # the blank delta was the space after the mark
        else:
            self._open_core = None
        if not self._pending:
            self._open_core = None

    def _sentence_ends(self, text: str) -> tuple[list[int], str | None]:
        """Where sentences end in a delta, and the text up to a mark at its end that the next
        delta decides (None: none). A full stop after an abbreviation is no end ("Dr. Lee", "e.g.
        the"; `cuts.abbreviation_holds`, the bridge's rule); a "." or ":" with nothing after it in
        this delta waits: at the very end ("3." + "50"), or before spaces where an abbreviation
        could hold ("Dr. " + "Lee")."""
        ends: list[int] = []
        open_core = before = None
        for m in _SENTENCE_END.finditer(text):
            mark, after = text[m.start()], text[m.end() :].lstrip()
            if before is None:  # the pending text's tail, joined only for a delta with a mark in it
                before = "".join(self._pending[-_CORE_CHARS:])[-_CORE_CHARS:]
            core = before + text[: m.end()]
            if mark in _OPEN_END and not after:
                if m.end() == len(text) or (mark == "." and any(abbreviation_holds(core, c) for c in "aA1")):
                    open_core = core
                    continue
            elif mark == "." and after and abbreviation_holds(core, after[0]):
                continue
            ends.append(m.end())
        return ends, open_core

    def _open_end_cuts(self, text: str) -> bool:
        """Whether the mark the last delta ended at ends a sentence, now that `text` follows it:
        when a space (before or at this delta's start) or a CJK character parts the two, and the
        word before a full stop is no abbreviation that keeps the next word with it."""
        core = self._open_core or ""
        first = text.lstrip()[:1]
        parted = self._open_spaced or text[:1].isspace() or is_cjk_char(first)
        return parted and not (core.endswith(".") and abbreviation_holds(core, first))

    def _add(self, text: str, units: int) -> None:
        """Text (and its units) joins the pending segment."""
        if not self._pending:
            self._pending_start = self.next_unit
        if text:
            self._pending.append(text)
            self._pending_chars += len(text)
        self.next_unit += units

    def _full(self) -> bool:
        return bool(self._pending) and self.next_unit - self._pending_start >= self._limit()

    def _limit(self) -> int:
        """Units the pending segment may hold. With a starter (`starter_units` n > 0) an
        utterance's segments grow n, 2n, then `max_pending_units`: the first audio comes after a
        few words (or the first clause) instead of a sentence, and each next segment is written
        while the one before plays, as the bridge's segmenter does for an LLM's reply. A listener
        that ran dry mid-utterance starts the schedule again (`starved`)."""
        n, most = self.config.starter_units, self.config.max_pending_units
        made = self._segments_made - self._schedule_from
        if n == 0 or made >= 2:
            return most
        return min(most, n << made)

    def _admit(self, text: str) -> str:
        """The delta's text as kept: checked like any request's text, whitespace between words
        kept as one space (a stream of blank deltas costs nothing), within the queue bound.
        Raises `ProtocolError` and changes nothing when refused."""
        try:
            check_characters(text)
        except VoxgateError as exc:
            raise ProtocolError(exc.code, exc.message) from None
        if len(text) > self.max_text_chars:
            raise ProtocolError("text_too_long", f"a delta has at most {self.max_text_chars} characters")
        if not text.strip():
            last = self._pending[-1] if self._pending else ""
            text = " " if last and not last[-1].isspace() else ""
        if self._pending_chars + self._queued_chars + len(text) > self.text_queue_chars:
            raise ProtocolError("text_queue_full", f"{self.text_queue_chars} characters are waiting to be spoken; "
                                "send more after the next units.done", expected_unit_index=self.next_unit)  # fmt: skip
        return text

    def flush(self, now: float | None = None) -> None:
        """Pending text becomes a segment (if it holds any units); `now` stamps it."""
        text = "".join(self._pending)
        if self.next_unit > self._pending_start and text.strip():
            at = self.last_delta_at if now is None else now
            first = self._segments_made == 0
            segment = Segment(self.utterance, text.strip(), self._pending_start, self.next_unit - 1, at, first)
            self._segments_made += 1
            self._queue.append(segment)
            self._queued_chars += len(segment.text)
        self._pending.clear()
        self._pending_chars = 0
        self._pending_start = self.next_unit
        self._open_core = None

    def starved(self, now: float) -> None:
        """The listener has heard everything and has nothing more coming (no segment queued or
        being voiced, no audio unsent), while the utterance's text comes slower than it is
        spoken: the next segment is sized like its first (a starter's few words or first clause,
        then growing again) rather than waiting for a full one, and pending text that already
        fills it is spoken now. Once per starvation: the schedule restarts only after a segment
        was made since it last did."""
        if self.config.segments != "auto" or self.config.starter_units == 0 or not self.open:
            return
        if self._inflight is not None or self._queue or self.unsent() is not None:
            return
        if self._segments_made == self._schedule_from:
            return  # already at the schedule's start
        self._schedule_from = self._segments_made
        # Either cut waits for a word's end (`_word_boundary`): "Well, wor" may go on as "world".
        pending = "".join(self._pending)
        if _word_boundary(pending[-1:], "") and (self._full() or _CLAUSE_END.search(pending)):
            self.flush(now)

    def idle_flush_due(self, now: float, idle_s: float) -> bool:
        return self.config.segments == "auto" and bool(self._pending) and now - self.last_delta_at >= idle_s

    def end(self, now: float | None = None) -> None:
        """text.end: speak what is pending, then close the utterance."""
        self._refuse_after_done()
        self.flush(now)
        self.open = self.ending = True
        self._maybe_finish_utterance()

    def finish(self) -> None:
        """session.end: end the open utterance (if any), then session.done."""
        if self.open:
            self.end()
        self.finishing = True
        self._maybe_finish_session()

    def cancel(self) -> int:
        """Stop the open utterance now; returns its number (the caller stops its engine stream).
        The open utterance's segments and unsent entries are the tails of the queue and the
        log, so a cancel costs what it removes, never the whole log."""
        self._refuse_after_done()
        cancelled = self.utterance
        self._pending.clear()
        self._pending_chars = 0
        self._pending_start = self.next_unit
        while self._queue and self._queue[-1].utterance == cancelled:
            self._queued_chars -= len(self._queue.pop().text)
        self._inflight = None
        while len(self._log) > self._cursor and self._log[-1].utterance == cancelled:
            entry = self._log.pop()
            self._unsent_bytes -= entry.size
            self._log_bytes -= entry.size
        self._close_utterance("cancelled")
        return cancelled

    def _refuse_after_done(self) -> None:
        """session.done is logged, so the session is over: a cancel would remove it from the log
        before it is sent (the tail of the log is the cancelled utterance's), and a text.end
        would log an utterance.done after it."""
        if self.done:
            raise ProtocolError("utterance_ending", "the session has ended (session.end was sent)")

    # ------------------------------------------------------------------ synthesis

    def take_segment(self) -> Segment | None:
        if self._inflight is not None or not self._queue:
            return None
        self._inflight = self._queue.popleft()
        self._inflight_samples = 0
        self._queued_chars -= len(self._inflight.text)
        return self._inflight

    @property
    def speakable(self) -> bool:
        """A segment waits for the engine."""
        return bool(self._queue)

    def current(self, segment: Segment) -> bool:
        """False once the segment's utterance was cancelled (its output is discarded)."""
        return self._inflight is segment

    def audio(
        self,
        segment: Segment,
        payload: bytes,
        samples: int,
        stamps: tuple[float, ...] = (),
        marks: dict[str, float] | None = None,
    ) -> None:
        """Log a piece of the segment's audio; `stamps` (the caller's clock readings on the way
        to its first audio) and `marks` (the engine's) are kept on the segment's first entry,
        for the writer's timings."""
        if not self.current(segment) or not payload:
            return
        header = {"type": "audio", "seq": self._seq, "utterance": segment.utterance,
                  "unit_start": segment.unit_start, "unit_end": segment.unit_end,
                  "samples": samples, "bytes": len(payload)}  # fmt: skip

        self._seq += 1
        self.audio_samples += samples
        self._inflight_samples += samples
        entry = self._append(header, payload, segment.utterance, segment.unit_end)
        if segment is not self._last_audio_of:
            entry.first, entry.stamps, entry.text = True, stamps, segment.text
            entry.ready_at = None if segment.again else segment.queued_at  # its first audio is timed once
            entry.marks = marks
            entry.opens_utterance = self._last_audio_of is None or self._last_audio_of.utterance != segment.utterance
            self._audio_before, self._last_audio_of = self._last_audio_of, segment

    def segment_done(self, segment: Segment, error: tuple[str, str] | None = None) -> None:
        """The engine finished the segment (or failed: `error` = (code, message))."""
        if not self.current(segment):
            return
        if error is not None:
            self._append({"type": "error", "code": error[0], "message": error[1], "fatal": False},
                         None, segment.utterance, segment.unit_end)  # fmt: skip
        done = self._append({"type": "units.done", "utterance": segment.utterance, "unit_start": segment.unit_start,
                             "unit_end": segment.unit_end}, None, segment.utterance, segment.unit_end)  # fmt: skip
        done.text = segment.text
        self._inflight = None
        self._maybe_finish_utterance()

    def requeue(self, segment: Segment) -> bool:
        """The segment stopped before its end while nobody listened (the engine gave its place to
        a listener elsewhere, `Preempted`, or the gateway parked it with its output full): its
        audio so far leaves the log and it goes back
        to the front of the queue, to be voiced again whole. A client that resumes gets one
        whole segment either way (it discards the audio of a segment it had no `units.done`
        for when its socket dropped, docs/protocol.md); the removed messages' `seq` numbers
        are not used again. True when some of that audio went out on the current socket
        (one that resumed after the engine stopped the segment): that client must be made to
        resume again, or it hears the segment's start twice."""
        if not self.current(segment):
            return False
        kept: list[Entry] = []
        sent_here = False
        cursor, sent_from = self._cursor, self._sent_from
        for index, entry in enumerate(self._log):
            m = entry.message
            if m["type"] != "audio" or m["utterance"] != segment.utterance or m["unit_start"] != segment.unit_start:
                kept.append(entry)
                continue
            self._log_bytes -= entry.size
            if index < cursor:
                self._cursor -= 1
                sent_here = sent_here or index >= sent_from
                self._sent_from -= index < sent_from
            else:
                self._unsent_bytes -= entry.size
                sent_here = sent_here or entry is self._on_the_way  # its bytes are reaching the client
        self._log = kept
        self.audio_samples -= self._inflight_samples  # trimmed entries' too (their resume is refused anyway)
        if self._last_audio_of is segment:
            self._last_audio_of = self._audio_before
        self._inflight = None
        self._queue.appendleft(replace(segment, again=True))
        self._queued_chars += len(segment.text)
        return sent_here

    def _maybe_finish_utterance(self) -> None:
        busy = self._pending or self._inflight is not None or any(s.utterance == self.utterance for s in self._queue)
        if self.ending and not busy:
            self._close_utterance("completed")

    def _close_utterance(self, status: str) -> None:
        last = self.next_unit - 1
        message = {"type": "utterance.done", "utterance": self.utterance, "status": status, "unit_end": last}
        self._append(message, None, self.utterance, last + 0.5)
        self.utterance += 1
        self.open = self.ending = False
        self._segments_made = self._schedule_from = 0
        self._maybe_finish_session()

    def _maybe_finish_session(self) -> None:
        if self.finishing and not self.open and not self.done:
            self.done = True
            audio_s = round(self.audio_samples / self.sample_rate, 3)
            self._append({"type": "session.done", "units": self.next_unit, "audio_s": audio_s},
                         None, self.utterance, self.next_unit + 0.5)  # fmt: skip

    # ------------------------------------------------------------------ the log

    def _append(self, message: dict[str, Any], payload: bytes | None, utterance: int, key: float) -> Entry:
        entry = Entry(message, payload, utterance, key)
        self._log.append(entry)
        self._unsent_bytes += entry.size
        self._log_bytes += entry.size
        self._trim()
        return entry

    def _trim(self) -> None:
        """Drop sent entries from the front beyond the replay budget (sent output kept for a
        resume; unsent output is always kept and does not count against it)."""
        drop = 0
        while drop < self._cursor and self._log_bytes - self._unsent_bytes > self.replay_bytes:
            entry = self._log[drop]
            self._log_bytes -= entry.size
            self._trimmed_key = max(self._trimmed_key, entry.key)
            drop += 1
        if drop:
            del self._log[:drop]
            self._cursor -= drop
            self._sent_from = max(0, self._sent_from - drop)

    def unsent(self) -> Entry | None:
        return self._log[self._cursor] if self._cursor < len(self._log) else None

    def sending(self, entry: Entry) -> None:
        """The writer has started sending `entry` (the one `unsent()` gave it)."""
        self._on_the_way = entry

    def mark_sent(self, entry: Entry | None = None) -> None:
        """The writer has sent `entry` (default: the entry at the cursor). Nothing moves when a
        cancel or a requeue removed it while its bytes were on the way: the cursor is already
        at what comes next."""
        self._on_the_way = None
        if self._cursor >= len(self._log) or (entry is not None and self._log[self._cursor] is not entry):
            return
        self._unsent_bytes -= self._log[self._cursor].size
        self._cursor += 1
        self._trim()

    @property
    def unsent_bytes(self) -> int:
        return self._unsent_bytes

    @property
    def drained(self) -> bool:
        """Everything logged has been sent."""
        return self._cursor == len(self._log)

    def resume(self, last_unit_received: int) -> None:
        """Send again everything after unit `last_unit_received` (see docs/protocol.md)."""
        if last_unit_received >= self.next_unit:
            raise ProtocolError("resume_not_available", f"unit {last_unit_received} was never received here")
        if last_unit_received < self._trimmed_key:
            raise ProtocolError("resume_not_available", "that point is older than the replay buffer")
        start = next((i for i, e in enumerate(self._log) if e.key > last_unit_received), len(self._log))
        self._cursor = self._sent_from = start
        self._on_the_way = None  # whatever was on its way went to a socket that is gone
        self._unsent_bytes = sum(e.size for e in self._log[start:])
