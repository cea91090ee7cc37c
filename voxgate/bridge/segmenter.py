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
  pass `main_max_width` columns (at its last clause mark at least 2/3 of `main_min_width`
  wide, else its last word boundary at least `main_min_width` wide: no length cut leaves a
  fragment such as "said,"; past an unbreakable span, just after it), or once it holds
  `cjk_flush_units` CJK characters (a Latin word counts one) and no punctuation, at a phrase
  boundary (after a particle such as 的/了, before a function word such as 和/在/我); with none,
  at a word boundary (jieba) once it holds 1.5 times as many.
  The segment right after the starter has `second_max_width` instead: the starter lasts about
  a second, and a full-width second segment (written by the LLM, then synthesised) would leave
  a silence after it; segments then grow to full width.
- final: what is left at `flush()`; the only kind that may be shorter than `min_chars`.

Widths are display columns: a CJK character or emoji counts 2, which also tracks speaking
time (one syllable) better than a count of code points. Defaults: starter 3 words / 6 CJK
characters, min 3 characters, main 20..60 columns (10..30 CJK characters; the second segment
at most 40), CJK length cut after 12 characters without punctuation (the 8..12 of the original design, at its top so
fewer words are cut in half).

Where a cut may fall at all is `cuts.py`'s business (numbers, abbreviations, markup, CJK words
and more stay whole; read its docstring). An unmatched markup or quotation opener holds a
boundary at most `max_hold_words` (6) words, never the reply, the starter included. A cut
is decided only from text that later deltas cannot change, so the segments are the same
however the text is split into deltas, and the `raw` fields of a stream's segments
concatenate to its input exactly (a stream of only whitespace yields none). A segment with
nothing to say (emoji, a table rule, bare markup) is never cut off on its own: it joins the
text after it; only a reply that ends in one leaves an unspeakable final segment
(`Segment.speakable` is False: the pipeline skips it).

Each push costs about the same at any reply length: the scan resumes where it stopped (no rule
reads where a segment starts, so an emitted cut keeps the boundaries found after it, and their
running sizes stay: the segment's base moves, nothing is measured again), and text more than a
few hundred characters behind the pending segment is dropped. What a push costs is mostly
jieba: one call per gap between two CJK characters (~2 us with the rules around it; more when
its dictionary is out of the CPU's caches), so the gaps of a main segment's first `_blind`
characters (narrower than any main choice reads: under `main_min_width` columns and
`cjk_flush_units` units) are not judged at all: about 60% of the calls on unpunctuated Chinese,
with the same segments (tests/unit/test_segmenter.py). A boundary whose
verdict waits for a span's closer is held while the scan goes on, so no push judges a span's
worth of text at once (the longest single pushes of the written corpus: ~230-380 -> ~100 us).
Measured on the 2-core VM: BENCHMARKS.md, issue 18.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from voxgate.bridge.cuts import (
    CLAUSE,
    HOLD,
    SENTENCE,
    START,
    Cut,
    Gap,
    ScanState,
    scan,
    skip_space,
    speakable,
    wide_units_only,
    width,
)  # fmt: skip
from voxgate.text import CJK, count_units

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
    max_span_chars: int = 48  # markup or brackets not closed within this many characters are plain text
    max_hold_words: int = HOLD  # a boundary waits at most this many words for a span's closer (code: twice)

    def __post_init__(self) -> None:
        if min(self.starter_max_words, self.starter_max_cjk, self.min_chars, self.cjk_flush_units) < 1:
            raise ValueError("segmenter thresholds must be positive")
        if not self.min_chars <= self.main_min_width <= self.main_max_width:
            raise ValueError("need min_chars <= main_min_width <= main_max_width")
        if self.second_max_width < self.min_chars:
            raise ValueError("need second_max_width >= min_chars")
        if self.max_span_chars < 2:
            raise ValueError("max_span_chars must be at least 2")
        if self.max_hold_words < 1:
            raise ValueError("max_hold_words must be positive")


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of speech: `text` for the engine, `raw` the exact characters it consumed."""

    text: str
    kind: Kind
    trigger: Trigger
    index: int
    raw: str

    @property
    def speakable(self) -> bool:
        """False for a final segment of only emoji or markup: nothing to synthesise."""
        return speakable(self.text)


class Segmenter:
    """Cuts one streamed reply into starter / main / final segments; see the module docstring.

    `openers` are phrases whose audio is cached (the starter cache): a reply that begins with
    one gets it as its starter as soon as it is certain: at once for a comma ("Sure,"), at the
    next character for a sentence end ("Okay." is not the start of "Okay..."), so the cached
    audio can start with no wait for the LLM's next words. A phrase with no mark of its own
    ("好的", "嗯") is the opener when a mark follows it ("嗯，", "好的。"; not "好的东西"), and the
    mark goes with it. `min_chars` does not apply: a cached opener costs no engine call.
    """

    KEEP = 256  # characters kept before the pending segment: every look back is shorter
    TRIM_AT = 4096  # drop what is behind once this much has piled up (amortised)

    def __init__(self, config: SegmenterConfig | None = None, openers: Iterable[str] = ()) -> None:
        self.config = config or SegmenterConfig()
        stripped = (phrase.strip() for phrase in openers)
        usable = {p for p in stripped if p and speakable(p)}
        self.openers = sorted(usable, key=lambda p: (-len(p), p))  # the longest match first
        cfg = self.config
        narrowest = min(cfg.main_min_width, cfg.second_max_width)  # no main choice reads a gap narrower
        self._blind = min((narrowest + 1) // 2, cfg.cjk_flush_units)  # characters: at most 2 columns each
        self.reset()

    def reset(self) -> None:
        """Forget the stream (barge-in, or the start of the next reply)."""
        self._text = ""  # the stream from a little before the pending segment
        self._start = 0  # where the pending (not yet emitted) text begins
        self._index = 0
        self._cuts: list[Cut] = []  # boundaries of the pending segment found so far
        self._sizes: list[_Size] = []  # running sizes up to each cut, from `_base` (built as cuts come)
        self._base = _ORIGIN  # the running sizes at the pending segment's start
        self._judged: tuple[int, int | None, int | None, bool] = (0, None, None, False)  # _choose_main's place
        self._scanned = 0  # where the scan resumes
        self._seen = -1  # the length of the text at the last scan
        self._state: ScanState = START  # at `_scanned`: inside a ``` block, long spans open
        self._fresh = False  # boundaries kept from the last segment's scan wait for a choice
        self._starter_costs: list[int | None] = []  # per cut of the starter: its cost, None if too short

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
        first = bisect_right(self._cuts, pos, key=_at)  # no rule reads where a segment starts: no rescan
        kept = self._cuts[first:]
        cut_here = first > 0 and self._cuts[first - 1].pos == pos
        self._start, self._index = pos, self._index + 1
        if self._start > self.TRIM_AT:
            drop = self._start - self.KEEP
            self._text, self._start, self._scanned = self._text[drop:], self._start - drop, self._scanned - drop
            self._seen -= drop
            self._state = _shifted(self._state, drop)
            kept = [Cut(cut.pos - drop, cut.gap) for cut in kept]
        self._judged = (0, None, None, False)
        if cut_here:  # the running sizes stay; the segment's start moves to the cut emitted: nothing measured again
            self._base = self._sizes[first - 1]
            self._cuts, self._sizes = kept, self._sizes[first:]
        else:  # an opener or the end: measure
            self._cuts, self._sizes, self._base = [], [], _ORIGIN
            self._measure(kept)
        self._fresh = bool(kept)  # the next segment's boundaries, still to be chosen from
        return segment

    def _next_cut(self, final: bool) -> tuple[int, Trigger] | None:
        text = self._text
        if self._index == 0 and (opener := self._opener(final)) is not None:
            return opener, "starter"
        found = []
        if final or len(text) != self._seen:  # after a cut in the same push the scan would stop where it did
            judge_from = self._start + self._blind if self._index else 0  # gaps no main choice can take: not judged
            cap = self.config.max_span_chars
            hold = self.config.max_hold_words
            found, self._scanned, self._state = scan(text, self._scanned, final, cap, self._state, judge_from, hold)
            self._seen = len(text)
            self._measure(found)
        if not (found or self._fresh or final):
            return None  # no new boundary: the choice would be the same as last time
        self._fresh = False
        cut = self._choose_main(self._cuts) if self._index else self._choose_starter(self._cuts)
        if cut and final and (len(text[cut[0] :].strip()) < self.config.min_chars or not speakable(text[cut[0] :])):
            return None  # a short or unspeakable tail joins the final segment instead of standing alone
        return cut

    def _opener(self, final: bool) -> int | None:
        """The end of a cached opener that the reply begins with, if certain."""
        text, lead = self._text, skip_space(self._text, self._start)
        marks = SENTENCE + CLAUSE
        for phrase in self.openers:
            if not text.startswith(phrase, lead):
                continue
            end = lead + len(phrase)
            if phrase[-1] not in marks:  # "嗯": the opener only with a mark after it, which it takes
                if end == len(text):
                    return end if final else None
                if text[end] not in marks:
                    continue  # "好的东西" does not open with "好的"; a shorter phrase may still match
                end += 1
            if text[end - 1] in CLAUSE:
                return end
            if end == len(text):
                return end if final else None
            return None if text[end] in marks else end  # "Okay." but not "Okay..."
        return None

    def _segment(self, cut: Cut) -> str:
        return self._text[self._start : cut.pos].strip()

    def _choose_starter(self, cuts: list[Cut]) -> tuple[int, Trigger] | None:
        """The last boundary within the bound (a clause mark at once); a boundary between two
        CJK words inside a phrase only when no other fits."""
        cfg, last, lexical = self.config, None, None
        full = cfg.starter_max_words * cfg.starter_max_cjk
        step = min(cfg.starter_max_words, cfg.starter_max_cjk)
        costs = self._starter_costs
        for k, cut in enumerate(cuts):
            if k == len(costs):  # the starter's start stays put and its cuts only grow: each measured once
                seg = self._segment(cut)
                costs.append(self.starter_cost(seg) if len(seg) >= cfg.min_chars and speakable(seg) else None)
            cost = costs[k]
            if cost is None:
                continue
            if cost > full:
                fallback = last if last is not None else lexical
                return (cut.pos if fallback is None else fallback), "starter"
            if cut.gap == Gap.LEXICAL:
                lexical = cut.pos
                continue
            if cut.gap >= Gap.CLAUSE or cost + step > full:
                return cut.pos, "starter"
            last = cut.pos
        fallback = last if last is not None else lexical
        held = self._state.held  # boundaries awaiting a span's verdict: later cuts lie at or past the first
        certain = held[0][0].pos if held else self._scanned
        if fallback is not None and self.starter_cost(self._text[self._start : certain]) > full:
            return fallback, "starter"  # later cuts lie past `certain`, so past the bound
        return None

    def starter_cost(self, text: str) -> int:
        """Words cost starter_max_cjk, CJK characters starter_max_words: full at their product.
        Units as `voxgate.text.split_units` has them (a CJK character; a run of other non-space
        characters), with a letter or digit; counted by two regex passes without building them
        (~60 -> ~5 -> ~1 us for 16 Chinese characters: it runs on every cut of the starter)."""
        cfg = self.config
        return cfg.starter_max_words * len(_CJK_LETTER.findall(text)) + cfg.starter_max_cjk * len(
            _SPOKEN_RUN.findall(text)
        )

    def _measure(self, found: list[Cut]) -> None:
        """Running sizes of the pending text up to each new cut: each push measures only the
        text it added, so choosing stays cheap however many cuts the segment has."""
        text, cuts, sizes = self._text, self._cuts, self._sizes
        before = sizes[-1] if sizes else self._base
        for cut in found:
            piece = text[cuts[-1].pos if cuts else self._start : cut.pos]
            chars = before.chars + len(piece)
            if wide_units_only(piece):  # CJK characters and marks: 2 columns and one unit each, no need to count
                before = _Size(before.columns + 2 * len(piece), before.units + len(piece), chars,
                               chars if speakable(piece) else before.said_at)  # fmt: skip
            else:
                before = _Size(before.columns + width(piece), before.units + count_units(piece), chars,
                               chars if speakable(piece) else before.said_at)  # fmt: skip
            sizes.append(before)
            cuts.append(cut)

    def _choose_main(self, cuts: list[Cut]) -> tuple[int, Trigger] | None:
        """The first sentence end; a clause mark once `main_min_width` wide; past the maximum
        width, the last clause mark at least 2/3 of `main_min_width` wide, else the last word
        boundary at least `main_min_width` wide, or, when an unbreakable span leaves none, the
        first cut after it: wider, never a fragment. Resumes at the first cut not yet judged."""
        cfg, text, start, sizes = self.config, self._text, self._start, self._sizes
        base_columns, base_units, base_chars, _ = self._base
        max_width = cfg.second_max_width if self._index == 1 else cfg.main_max_width
        min_chars, min_width = cfg.min_chars, cfg.main_min_width
        narrowest_clause = min_width * 2 // 3
        phrase_flush, word_flush = cfg.cjk_flush_units, cfg.cjk_flush_units * 3 // 2  # phrase; any word: 1.5x
        lead = skip_space(text, start) - start
        judged, clause, weak, punctuated = self._judged  # punctuated: the CJK length cut is for text without any
        found: tuple[int, Trigger] | None = None
        k = judged
        for k in range(judged, len(cuts)):  # locals and plain ints: this runs once per boundary after each cut
            cut, size = cuts[k], sizes[k]
            pos, gap = cut
            spaces = lead + (_trailing_space(text, start, pos) if text[pos - 1].isspace() else 0)
            if size.chars - base_chars - spaces >= min_chars and size.said_at > base_chars:
                if gap == _SENTENCE:
                    found = pos, "punctuation"
                    break
                columns = size.columns - base_columns - spaces
                if columns > max_width:
                    found = (clause if clause is not None else weak if weak is not None else pos), "length"
                    break
                if gap == _CLAUSE and columns >= min_width:
                    found = pos, "punctuation"
                    break
                flush = phrase_flush if gap == _CHAR else word_flush
                if gap <= _CHAR and not punctuated and size.units - base_units >= flush:
                    found = pos, "length"
                    break
                if gap == _CLAUSE and columns >= narrowest_clause:
                    clause = pos  # "To install it," yes; "said," no
                elif columns >= min_width:
                    weak = pos
            punctuated = punctuated or gap >= _CLAUSE
        else:
            k = len(cuts)
        self._judged = (k, clause, weak, punctuated)
        return found


class _Size(NamedTuple):  # a tuple, not a frozen dataclass: one is built per boundary (~0.2 us against ~1 us)
    """Running sizes of the text from an origin (the stream's, or the last opener's) up to a
    cut: a segment's sizes are the differences from those at its start (`Segmenter._base`), so
    emitting a segment moves the base and measures nothing again."""

    columns: int = 0  # display width (CJK 2)
    units: int = 0  # CJK characters and Latin words
    chars: int = 0
    said_at: int = -1  # `chars` at the end of the last piece with a letter or digit: a segment speaks if past its start


_ORIGIN = _Size()


def _shifted(state: ScanState, drop: int) -> ScanState:
    """The scan's state after the text's first `drop` characters are gone (a span still open,
    or one a held boundary waits on, lies within a span's limit of the scan: not among them)."""

    def openers(guards: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(g - drop for g in guards if g >= drop)

    held = tuple((Cut(cut.pos - drop, cut.gap), openers(guards)) for cut, guards in state.held)
    return ScanState(state.fenced, openers(state.guards), held)


_SENTENCE, _CLAUSE, _CHAR = int(Gap.SENTENCE), int(Gap.CLAUSE), int(Gap.CHAR)  # plain ints compare faster


def _at(cut: Cut) -> int:
    return cut.pos


_CJK_LETTER = re.compile(f"(?=[^\\W_])[{CJK}]")  # a CJK unit with a letter or digit ([^\W_]: str.isalnum)
# A unit of other characters (a run of them) with a letter or digit: found from the run's start
# to its first letter or digit, so a run of marks costs one pass (hostile "!!!...", not its square).
_SPOKEN_RUN = re.compile(f"(?<![^\\s{CJK}])[^\\s{CJK}]*?(?![{CJK}])[^\\W_]")


def _trailing_space(text: str, start: int, end: int) -> int:
    i = end
    while i > start and text[i - 1].isspace():
        i -= 1
    return end - i
