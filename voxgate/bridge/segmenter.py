"""Streaming text segmenter: LLM text deltas in, speakable segments out (pure, no I/O).

`Segmenter.push(delta)` returns the segments that became certain, `flush()` ends the stream
and returns the rest, `reset()` drops everything (barge-in). Segments come in three kinds:

- starter: the first segment, cut as early as a natural boundary allows so the first audio
  starts at once: the first comma or sentence end within `starter_max_words` Latin words /
  `starter_max_cjk` CJK characters (mixed text pays pro rata), else the last word (or CJK
  character) boundary within that limit.
- main: cut at a sentence end (. ! ? followed by space, end or a closing quote; 。！？…; a
  line break) as soon as the segment has `min_chars` characters; at a clause mark
  (, ; : dashes 、，；：) once it is `main_min_width` columns wide; a length cut when it would
  pass `main_max_width` columns (at its last clause mark, else its last word boundary), or
  once it holds `cjk_flush_units` CJK characters (a Latin word counts one) and no punctuation.
  The segment right after the starter has `second_max_width` instead: the starter lasts about
  a second, and a full-width second segment (written by the LLM, then synthesised) would leave
  a silence after it; segments then grow to full width.
- final: what is left at `flush()`; the only kind that may be shorter than `min_chars`.

Widths are display columns: a CJK character or emoji counts 2, which also tracks speaking
time (one syllable) better than a count of code points. Defaults: starter 3 words / 6 CJK
characters, min 3 characters, main 20..60 columns (10..30 CJK characters; the second segment
at most 40), CJK length cut
after 12 characters without punctuation (the 8..12 of the original design, at its top so
fewer words are cut in half).

Cuts fall only at whitespace after a word, after punctuation, or between two CJK characters,
and never inside numbers (3.14, 1,000, 12:30), abbreviations (Mr., e.g., U.S.), URLs, e-mail
addresses, emoji sequences, markdown (`code`, **bold**, [text](url), a list marker and its
item), or between a Latin term and the Chinese around it. A cut is decided only from text
that later deltas cannot change (a boundary waits for the character after it), so the
segments are the same however the text is split into deltas, and the `raw` fields of a
stream's segments concatenate to its input exactly (a stream of only whitespace yields none).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal, NamedTuple

from voxgate.text import count_units, is_cjk_char, split_units

Kind = Literal["starter", "main", "final"]
Trigger = Literal["starter", "punctuation", "length", "flush"]


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    """Thresholds; widths are in display columns (CJK characters and emoji count 2)."""

    starter_max_words: int = 3
    starter_max_cjk: int = 6
    min_chars: int = 3
    main_min_width: int = 20
    main_max_width: int = 60
    second_max_width: int = 40  # the segment after the starter: speakable before the starter's audio runs out
    cjk_flush_units: int = 12
    max_span_chars: int = 300  # an unclosed ` ** or [ stops protecting after this many characters

    def __post_init__(self) -> None:
        if min(self.starter_max_words, self.starter_max_cjk, self.min_chars, self.cjk_flush_units) < 1:
            raise ValueError("segmenter thresholds must be positive")
        if not self.min_chars <= self.main_min_width <= self.main_max_width:
            raise ValueError("need min_chars <= main_min_width <= main_max_width")
        if self.second_max_width < self.min_chars:
            raise ValueError("need second_max_width >= min_chars")
        if self.max_span_chars < 2:
            raise ValueError("max_span_chars must be at least 2")


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of speech: `text` for the engine, `raw` the exact characters it consumed."""

    text: str
    kind: Kind
    trigger: Trigger
    index: int
    raw: str


class _Gap(IntEnum):
    CHAR = 1  # between two CJK characters
    WORD = 2  # whitespace between Latin words
    CLAUSE = 3
    SENTENCE = 4


class _Cut(NamedTuple):
    pos: int  # offset in the stream's text where the next segment starts
    gap: _Gap


_IDEOGRAPH = re.compile("[\u3005\u3007\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_SENTENCE = ".!?…。！？"
_CLAUSE = ",;:，、；：—"
_FREE = "…。！？，、；：—"  # CJK-style marks: a boundary even with no space after them
_CLOSERS = "\"'”’」』）)]》〉"
_TRAILING = _CLOSERS + "*_`"
_TITLE = re.compile(r"(?<![A-Za-z0-9.])(?:(?i:mrs?|ms|dr|prof|sr|jr|st|mt|gen|col|capt|rev|hon)|[A-Z])\.$")
_CLOCK = re.compile(r"[ap]\.m\.|[ap]m\b", re.I)  # "5 p.m.", "9 am": the time stays with its number
_ABBREV = re.compile(r"(?<![A-Za-z0-9.])(?:(?:[a-z]\.){2,}|(?:etc|vs|approx|cf|al|inc|ltd|corp|fig|dept|est)\.)$", re.I)
_LIST_MARKER = re.compile(r"\d{1,3}[.)]|[-*+•]|#{1,6}")


def _is_ideograph(ch: str) -> bool:
    return _IDEOGRAPH.match(ch) is not None


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _skip(text: str, i: int, chars: str | None) -> int:
    """The end of the run at `i` of characters in `chars` (None: whitespace)."""
    while i < len(text) and (text[i].isspace() if chars is None else text[i] in chars):
        i += 1
    return i


def _closing(text: str, closer: str, frm: int, limit: int, final: bool) -> int | None:
    """The end of `closer` searched in text[frm:limit]: -1 if it cannot come, None if it may still."""
    found = text.find(closer, frm, limit)
    if found >= 0:
        return found + len(closer)
    return -1 if final or limit <= len(text) else None


def _span_end(text: str, i: int, final: bool, cap: int) -> int | None:
    """The end of the markdown span opening at `i`; -1 if none opens there, None if undecided."""
    n, limit = len(text), i + cap
    if text[i] == "`":
        ticks = _skip(text, i, "`") - i
        if i + ticks == n and not final:
            return None
        return _closing(text, "`" * ticks, i + ticks, limit, final)
    if text[i] == "*":
        if i + 1 == n:
            return -1 if final else None
        return _closing(text, "**", i + 2, limit, final) if text[i + 1] == "*" else -1
    label = _closing(text, "]", i + 1, limit, final)  # a link: [text](url)
    if label is None or label < 0:
        return label
    if label == n:
        return -1 if final else None
    if text[label] != "(":
        return -1
    end = _closing(text, ")", label + 1, limit, final)
    stop = end if end is not None and end > 0 else min(n, limit)
    if any(ch.isspace() for ch in text[label:stop]):
        return -1
    return end


def _scan(text: str, start: int, final: bool, cap: int) -> list[_Cut]:
    """Boundaries after `start` that no later text can change; stops where one could."""
    n, cuts, i = len(text), [], start
    while i < n:
        ch = text[i]
        if ch in "`*[":
            end = _span_end(text, i, final, cap)
            if end is None:
                break
            if end > i:
                i = end
                continue
        if ch.isspace():
            end = _skip(text, i, None)
            if end == n and not final:
                break
            if not final and text[i - 1 : i].isdigit() and _clock_pending(text, end):
                break  # "5 p" may still become "5 p.m."
            if end < n and (gap := _classify(text, start, i, end)):
                cuts.append(_Cut(end, gap))
            i = end
        elif ch in _SENTENCE or ch in _CLAUSE:
            end = _skip(text, _skip(text, i, _SENTENCE + _CLAUSE), _CLOSERS)
            if end == n and not final:
                break
            if end < n and not text[end].isspace() and (gap := _classify(text, start, end, end)):
                cuts.append(_Cut(end, gap))
            i = end
        else:
            if i + 1 < n and _is_ideograph(ch) and _is_ideograph(text[i + 1]):
                cuts.append(_Cut(i + 1, _Gap.CHAR))
            i += 1
    return cuts


def _clock_pending(text: str, end: int) -> bool:
    """The text after a number's space could still grow into a clock suffix (a.m., pm)."""
    tail = text[end : end + 5]
    return not any(ch.isspace() for ch in tail) and any(
        form.startswith(tail.lower()) for form in ("a.m.", "p.m.", "am", "pm")
    )


def _classify(text: str, start: int, i: int, end: int) -> _Gap | None:
    """What kind of boundary the gap text[i:end] (whitespace or nothing) is, if any."""
    spaced, after = i < end, text[end]
    word_start = i
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start:i]
    if not word:
        return None  # whitespace opening the stream
    core = word.rstrip(_TRAILING)
    line = word_start
    while line > 0 and text[line - 1] in " \t":
        line -= 1
    if "\n" in text[i:end]:
        return _Gap.SENTENCE
    if (line == 0 or text[line - 1] == "\n") and _LIST_MARKER.fullmatch(word):
        return None  # "1. " and "- " stay with their item
    if core and core[-1] in _SENTENCE + _CLAUSE:
        if not spaced and core[-1] not in _FREE and not _is_ideograph(after):
            return None  # 3.14, 1,000, 12:30, example.com
        if core[-1] in _CLAUSE:
            return _Gap.CLAUSE
        if core[-1] != "." or core.endswith(".."):
            return _Gap.SENTENCE
        if _TITLE.search(core):
            return None  # "Mr. Smith", "J. Doe" stay together
        if not _ABBREV.search(core):
            return _Gap.SENTENCE
    elif core in ("-", "--", "–"):
        return _Gap.CLAUSE
    if not spaced or _is_ideograph(text[i - 1]) or _is_ideograph(after) or after in _SENTENCE + _CLAUSE:
        return None
    if core[-1:].isdigit() and _CLOCK.match(text, end):
        return None
    if _IDEOGRAPH.search(text, start, i):
        return None  # Latin terms inside Chinese text stay whole
    return _Gap.WORD


class Segmenter:
    """Cuts one streamed reply into starter / main / final segments; see the module docstring.

    `openers` are phrases whose audio is cached (the starter cache): a reply that begins with
    one that ends in punctuation ("Sure,", "Okay.") gets it as its starter the moment its last
    character arrives, with no wait for the next token, so the cached audio can start at once.
    """

    def __init__(self, config: SegmenterConfig | None = None, openers: Iterable[str] = ()) -> None:
        self.config = config or SegmenterConfig()
        stripped = (phrase.strip() for phrase in openers)
        usable = {p for p in stripped if len(p) >= self.config.min_chars and p[-1] in _SENTENCE + _CLAUSE}
        self.openers = sorted(usable, key=lambda p: (-len(p), p))  # the longest match first
        self.reset()

    def reset(self) -> None:
        """Forget the stream (barge-in, or the start of the next reply)."""
        self._text = ""  # the whole stream so far: cuts look back at the words before them
        self._start = 0  # where the pending (not yet emitted) text begins
        self._index = 0

    def push(self, delta: str) -> list[Segment]:
        """Add text; return the segments whose end is now certain."""
        self._text += delta
        return self._drain(final=False)

    def flush(self) -> list[Segment]:
        """End of stream: return everything left, the last as the final segment, and reset."""
        out = self._drain(final=True)
        if self._text[self._start :].strip():
            out.append(self._emit(len(self._text), "flush"))
        self.reset()
        return out

    def _drain(self, final: bool) -> list[Segment]:
        out = []
        while (cut := self._next_cut(final)) is not None:
            out.append(self._emit(*cut))
        return out

    def _emit(self, pos: int, trigger: Trigger) -> Segment:
        raw = self._text[self._start : pos]
        kind: Kind = "final" if trigger == "flush" else "main" if self._index else "starter"
        segment = Segment(text=raw.strip(), kind=kind, trigger=trigger, index=self._index, raw=raw)
        self._start, self._index = pos, self._index + 1
        return segment

    def _next_cut(self, final: bool) -> tuple[int, Trigger] | None:
        text = self._text
        if self._index == 0 and (opener := self._opener()) is not None:
            return opener, "starter"
        cuts = [c for c in _scan(text, self._start, final, self.config.max_span_chars) if c.pos < len(text)]
        cut = self._choose_main(cuts) if self._index else self._choose_starter(cuts)
        if cut and final and len(text[cut[0] :].strip()) < self.config.min_chars:
            return None  # a short tail joins the final segment instead of standing alone
        return cut

    def _opener(self) -> int | None:
        """The end of a cached opener that the reply begins with, if any."""
        lead = _skip(self._text, self._start, None)
        for phrase in self.openers:
            if self._text.startswith(phrase, lead):
                return lead + len(phrase)
        return None

    def _choose_starter(self, cuts: list[_Cut]) -> tuple[int, Trigger] | None:
        cfg, last = self.config, None
        full = cfg.starter_max_words * cfg.starter_max_cjk
        step = min(cfg.starter_max_words, cfg.starter_max_cjk)
        for cut in cuts:
            seg = self._text[self._start : cut.pos]
            if len(seg.strip()) < cfg.min_chars:
                continue
            cost = self._starter_cost(seg)
            if cost > full:
                return (cut.pos if last is None else last), "starter"
            if cut.gap >= _Gap.CLAUSE or cost + step > full:
                return cut.pos, "starter"
            last = cut.pos
        return None

    def _starter_cost(self, text: str) -> int:
        """Words cost starter_max_cjk, CJK characters starter_max_words: full at their product."""
        cfg, cost = self.config, 0
        for unit in split_units(text):
            if any(ch.isalnum() for ch in unit.text):
                cost += cfg.starter_max_words if is_cjk_char(unit.text) else cfg.starter_max_cjk
        return cost

    def _choose_main(self, cuts: list[_Cut]) -> tuple[int, Trigger] | None:
        cfg, text = self.config, self._text
        max_width = cfg.second_max_width if self._index == 1 else cfg.main_max_width
        clause = weak = None
        punctuated = False  # the CJK length cut is for text with no punctuation at all
        for cut in cuts:
            seg = text[self._start : cut.pos].strip()
            if len(seg) >= cfg.min_chars:
                if cut.gap == _Gap.SENTENCE:
                    return cut.pos, "punctuation"
                width = _width(seg)
                if width > max_width:
                    best = clause if clause is not None else weak if weak is not None else cut.pos
                    return best, "length"
                if cut.gap == _Gap.CLAUSE and width >= cfg.main_min_width:
                    return cut.pos, "punctuation"
                if cut.gap == _Gap.CHAR and not punctuated and count_units(seg) >= cfg.cjk_flush_units:
                    return cut.pos, "length"
                if cut.gap == _Gap.CLAUSE:
                    clause = cut.pos
                else:
                    weak = cut.pos
            punctuated = punctuated or cut.gap >= _Gap.CLAUSE
        return None
