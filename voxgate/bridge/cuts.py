"""Where a streamed reply may be cut: the boundary scanner under the segmenter (pure, no I/O).

`scan(text, at, final, ...)` walks the text from `at` and returns the boundaries it is sure
of, each with its strength (`Gap`: between two CJK words in a phrase, between two CJK
phrases, between Latin words, after a clause mark, after a sentence end), and where it
stopped: the first place where the text so far cannot decide (a boundary waits for what
follows it, a markup span for its closer). Every decision reads a bounded window of text (at
most `LOOKBACK` characters before the gap and a few after it, never where the segment began),
so the segments are the same however the text is split into deltas, and the cost of a delta
does not grow with the text before it.

No cut falls inside:
- numbers, times and dates (3.14, 1,000, 12:30, 9：00, 5 p.m., "June 28, 1919", "Thu., Oct.
  10"), URLs, e-mail addresses, paths;
- a number and the word before or after it ("Python 3.10", "USD 1,299", "No. 3", "+1 (800)
  555-0199", "149.6 million", "180 °C"), or around an operator ("p = 0.31", "n ≥ 30");
- a phrase left hanging: no cut after "the", "to", "of", "is" and the like ("I think the" |
  "best approach"), nor between two capitalised words of a name ("Bright Electronics Inc."),
  nor before a particle inside one ("Treaty of Versailles", "Leonardo da Vinci"), nor
  between two parties ("Smith v. Jones");
- an abbreviation and the word after it ("Ph.D. in", "Nov. 26", "Dr. Lee", "Ave. between"):
  the lexicons are pysbd's (a maintained rule-based sentence splitter, pinned). Running pysbd
  itself on the stream was measured first and is not usable here: ~30 ms per 200-character
  call on this machine, re-run on every delta, against a 50 us budget per delta; its lists
  with our context rules (a title always holds; a month or "No." holds before a number; any
  other abbreviation holds before a lower-case word or a number) keep its decisions at
  microseconds. pysbd's own context rules are not reproduced: it needs the whole sentence. A
  capitalised abbreviation before an initial is a citation ("Fed. R. Civ. P. 56");
- an inline list marker and its item ("options: 1. restart the router, or 2. reinstall");
- short markup, bracketed and quoted spans: `code`, **bold**, [text](url), (a + b), [0, 1),
  short CJK quotes and titles (「…」, 《…》), quotations (“…”, ‘…’, and "…" where the `"`
  opens: at the start, after a space or an opening mark, before a non-space; a quotation may
  run a third longer, inline code twice as long: a shell or SQL line); an opener whose closer
  does not come within that limit is plain text. Holding is bounded: a boundary waits at most
  `HOLD` (6) words after it for a closer (two CJK characters count a word; code twice as
  many): a span closed within 6 words of its opener is whole, a longer one keeps only its last
  6 words whole (a long quotation is speech, and may pause at its commas), so a stray `**`,
  `[` or `"` delays a cut by 6 words at most, never the reply, and the starter by no more.
  Six words are about 8 LLM tokens (0.1-0.2 s at 40-80 tokens/s), less than a starter's
  audio: a held main cut is not heard, a held starter costs that much; a quoted error message
  or title keeps its last clause whole. A `**` after a letter or digit is an operator (2**8),
  not bold; a ``` fence is not a span (code blocks are cut at their line breaks);
- a CJK word: a cut between two Chinese characters falls only at a word boundary of jieba
  (`rjieba`, jieba's Rust port: ~1.5 us per 10-character window; “加油” is one word), preferably
  where a phrase ends (after 的/了/吗..., before 和/是/我/这个...: `Gap.CHAR`; other word
  boundaries are `Gap.LEXICAL`, a last resort, and only where a phrase ends by jieba's
  part-of-speech tags: after a verb or between a subject and its predicate, not inside a noun
  phrase ("北京" | "南站", "日本单次" | "旅游签证"), after a number, a quantity or a preposition,
  nor between a verb and its complement ("笑" | "死我了"): `_phrase_break`), never before
  的/了, and never leaving one or two characters before a punctuation mark or an emoji ("见面可以"
  | "吗？", "累死" | "我了😂"), nor three after a modifier's 的 ("直立的" | "小尖角。"). Japanese
  (any kana nearby) is cut only after a particle (は が を に で も へ) before kanji or katakana,
  but not between a case particle and the predicate right after it ("距離を" | "取る", "電車に" |
  "乗る"), else (not after の, と, お..., nor a single kana between kanji: 問い合わせ) as a last
  resort: jieba has no Japanese dictionary and a Japanese analyser
  (MeCab + a dictionary) costs ~50 MB;
- a Latin term inside Chinese text, and the marks of a symbol standing alone ("like ! or #").
"""

from __future__ import annotations

import re
import unicodedata
from enum import IntEnum
from functools import lru_cache
from typing import NamedTuple

import rjieba
from pysbd.lang.english import English

from voxgate.text import says_something as speakable  # re-exported: the segmenter's name for it

rjieba.tag("预热")  # loads jieba's dictionary and tagger at import, not in the first reply's first cut

LOOKBACK = 64  # characters a decision may read before its gap (the word before it)
CJK_LEFT, CJK_RIGHT = 6, 4  # the jieba window around a gap between two CJK characters
HOLD = 6  # words (two CJK characters count one) a boundary may wait for a span's closer: see `scan`


class Gap(IntEnum):
    LEXICAL = 0  # between two CJK words inside a phrase ("北京" | "南站"): a last resort
    CHAR = 1  # between two CJK phrases: after a particle, before a function word
    WORD = 2  # whitespace between Latin words
    CLAUSE = 3
    SENTENCE = 4


class Cut(NamedTuple):
    pos: int  # offset in the text where the next segment starts
    gap: Gap


IDEOGRAPH = re.compile("[\u3005\u3007\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_IDEOGRAPHS = re.compile(IDEOGRAPH.pattern + "*")
_IDEOGRAPHS_END = re.compile(IDEOGRAPH.pattern + "*$")
_WIDE = IDEOGRAPH.pattern[1:-1] + "\u3000-\u303e\uac00-\ud7a3\uff01-\uff60\uffe0-\uffe6"  # 2 columns, 1 unit each
_WIDE_UNITS = re.compile(f"[{_WIDE}]*")
_WIDE_CHAR = re.compile(f"[{_WIDE}]")
_NARROW_OR_WIDE = re.compile(f"[\x00-\u0377\u2000-\u2064{_WIDE}]*")  # Latin, Greek, “”‘’—…: 1 column
_KANA = re.compile("[\u3040-\u30ff]")
_HIRAGANA = re.compile("[\u3041-\u309f]")
_JA_PARTICLES = "はがをにでもへ"  # a phrase ends after these (not の or と: 関ヶ原の戦い, ふるさと納税)
_JA_CASE = "をにがでへ"  # a case particle: the verb right after it is its phrase (距離を取る, 電車に乗る)
# A predicate: one or two kanji and okurigana that is not a particle ("取る", "確認する"; not "駅から").
_JA_PREDICATE = re.compile(
    "[\u4e00-\u9fff]{1,2}(?![のとはがをにでもへやかだ]|まで|より|など|だけ|しか|ほど|くら|ぐら)[\u3041-\u309f]"
)
_ZH_PARTICLES = "的了着过地得吗呢吧啊呀哦嘛"  # a phrase ends after these
_ZH_OPENERS = frozenset(  # a phrase starts with these
    """和 与 及 或 是 就 都 也 还 把 被 对 从 向 跟 让 而 但 又 再 才 并 将 要 会 能 所以 因为 然后 如果
    但是 而且 并且 或者 以及 可以 需要 应该 已经 我 你 他 她 它 我们 你们 他们 这 那 这个 那个 这些 那些
    一个 每 最 很 非常 比较""".split()  # noqa: SIM905 (a list literal of 60 words reads worse)
)  # not 在, 到, 给: as often the end of a verb (定在, 改到, 交给) as the start of a phrase
SENTENCE = ".!?…。！？"
CLAUSE = ",;:，、；：—"
_STOPS = SENTENCE + CLAUSE
_FREE = "…。！？，、；：—"  # CJK-style marks: a boundary even with no space after them
_CJK_STOPS = "。！？，、；："  # of those, the ones that end a clause or sentence after any CJK word
_WORD_CHAR = re.compile(f"(?=\\w){IDEOGRAPH.pattern}")  # a CJK character that is a letter (not ・ or ゠)
_CLOSERS = "\"'”’」』）)]》〉】"
_TRAILING = _CLOSERS + "*_`"
_MARKS = SENTENCE + CLAUSE + _CLOSERS
_MARK_SET = frozenset(_MARKS)
_DASHES = ("-", "--", "–", "—", "...", "…")
_OPERATORS = "=<>≤≥≈≠±×÷^+/*→"
_INFIX = "=<>≤≥≈≠±×÷^→"  # no cut before these either ("p =", "n ≥")
_NUMBER_PREFIX = "(+$€£¥#-−~≈<>"  # "(800)", "+1", "$5", "~3": a number follows
_BRACKETS = {"(": ")]}", "[": ")]}", "{": ")]}", "（": "）", "【": "】"}
_QUOTES = {"「": "」", "『": "』", "《": "》", "〈": "〉"}  # CJK titles and quotes (“加油” is a jieba word)
_QUOTE_SPAN = 16  # a quote protected whole: a word or a title
_QUOTATIONS = {"“": "”", "‘": "’", '"': '"'}  # quoted words or a short quotation (or error message)
_OPENS_QUOTE = "([{（【「『《—–-:：，,"  # before a `"` that opens ('say "hi"', '("x")'), with a space
_LETTERS = re.compile("[A-Za-z]*")
_CLAUSE_STOP = re.compile("[.!?…。！？,;:，、；：—\n]")  # a mark that ends the clause before a Latin word
_CLOCK = re.compile(r"[ap]\.m\.|[ap]m\b", re.I)  # "5 p.m.", "9 am": the time stays with its number
_LIST_MARKER = re.compile(r"\d{1,3}[.)]|[-*+•]|#{1,6}")
_INLINE_MARKER = re.compile(r"\(?(?:\d{1,2}|[a-z]|[ivx]{1,4})[.)]", re.I)
_TAIL_WORD = re.compile(r"[A-Za-z](?:[A-Za-z.]*[A-Za-z])?$")  # the Latin word a dot ends: "好的。Mr" -> "Mr"
_MULTI_DOT = re.compile(r"(?:[a-z]{1,2}\.)+[a-z]{1,5}", re.I)  # ph.d, u.s, e.g, a.m, d.phil

_ABBREVIATIONS = English.Abbreviation
_TITLES = frozenset(_ABBREVIATIONS.PREPOSITIVE_ABBREVIATIONS) | {
    "pres", "fr", "amb", "atty", "dir", "insp", "pvt", "supt", "mme", "mlle", "hon", "mx", "sat", "sun", "mon",
    "tue", "tues", "wed", "thu", "thur", "thurs", "fri",
}  # fmt: skip  # a name (or a date) follows
_BEFORE_NUMBERS = frozenset(_ABBREVIATIONS.NUMBER_ABBREVIATIONS) | {
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "vol", "ch", "chap", "sec", "eq", "pg", "fig", "figs", "ref", "tab", "par",
    "tel", "ca", "ed", "eds", "para", "paras", "fl", "flr", "ex", "cf", "ser", "sch",
}  # fmt: skip
# pysbd's list lacks some that replies use; they hold only before a lower-case word or a number.
_KNOWN = frozenset(_ABBREVIATIONS.ABBREVIATIONS) | _BEFORE_NUMBERS | {
    "approx", "est", "incl", "excl", "misc", "avg", "max", "min", "qty", "tbsp", "tsp", "oz",
    "lb", "lbs", "hrs", "mins", "secs", "yr", "yrs", "mos", "wk", "wks", "pt", "pts", "cca",
    "resp", "govt", "intl", "natl", "dept", "univ", "assoc", "corp", "co", "bros", "sq", "cu", "rte", "apt",
    "ste", "rm", "bldg", "hwy", "pkwy", "ln", "mi", "km", "kg", "cm", "ml", "mg",
    "fed", "civ", "crim", "supp", "evid", "cir", "stat", "ann", "amend", "ch", "cl", "subch", "reg", "regs",
}  # fmt: skip  # the last line: legal citations ("Fed. R. Civ. P. 56", "42 U.S.C. § 1983", "Cal. Civ. Code")


# Abbreviations that are also words ending sentences ("Ask me.", "The answer is no."): these
# hold the next word only when it goes on in lower case (or is a number); the rest always hold.
_WORDS = frozenset({
    "is", "me", "ok", "may", "man", "miss", "ill", "id", "con", "mass", "wash", "arc", "del", "cal", "co", "op",
    "ore", "res", "ref", "sec", "min", "ver", "exp", "fed", "no", "art", "ext", "est", "max", "mo", "pa", "la",
    "ut", "al", "ind", "mar", "jun", "jul", "aug", "dec", "rep", "pl", "rd", "ct", "hr", "ft", "mm", "pt", "fig",
    "vol", "ch", "tab", "par", "va", "ga", "wy", "ia", "md", "de", "ken", "don", "cap", "pp", "p", "nos",
    "bros", "assoc", "inc", "ltd", "corp", "dept", "univ", "govt", "etc", "yrs", "hrs", "mins", "secs", "lbs", "oz",
    "lb", "pts", "wks", "mos", "yr", "wk", "tsp", "tbsp", "qty", "avg", "misc", "incl", "excl", "approx",
    "mi", "km", "kg", "cm", "ml", "mg", "tel", "ca", "ed", "eds", "para", "paras", "fl", "flr", "ex", "cf", "ser",
    "sch",
})  # fmt: skip
# A word gap after these leaves the phrase hanging ("I think the" | "best approach"): none there.
_HANGING = frozenset(
    """a an the to of in on at by for with via from into onto about as than per my your his her
    its our their this that these those and or but nor if is are was were be been has have had will would can
    could should may might must do does did not no very so such some any each every all both more most less
    """.split()  # noqa: SIM905
)
_MONTHS = frozenset(
    """january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec""".split()  # noqa: SIM905
)
_DAYS = frozenset(
    """mon tue tues wed thu thur thurs fri sat sun monday tuesday wednesday thursday friday saturday
    sunday""".split()  # noqa: SIM905
)
# Written after a name: no cut before them ("Bright Electronics Inc.", "John Smith Jr.").
_AFTER_NAMES = ("inc", "ltd", "corp", "co", "llc", "plc", "gmbh", "jr", "sr", "esq", "phd", "st", "ave", "blvd", "rd",
                "ln", "hwy", "pkwy", "sq", "v", "vs")  # fmt: skip


def _word_before(text: str, i: int) -> str:
    """The run of non-space characters that ends at `i` (at most `LOOKBACK` of them; "" after a
    space). Split from the right in C: a regex `\\S*$` search retries from every start (~2 us)."""
    if i == 0 or text[i - 1].isspace():
        return ""
    return text[max(i - LOOKBACK, 0) : i].rsplit(None, 1)[-1]


def _clause_start(text: str, i: int, back: int) -> int:
    """Where the clause that reaches `i` starts: after the last mark within `back` characters."""
    found = _CLAUSE_STOP.search(text[max(i - back, 0) : i][::-1])
    return max(i - back, 0) if found is None else i - found.start()


def is_ideograph(ch: str) -> bool:
    return IDEOGRAPH.match(ch) is not None


def wide_units_only(text: str) -> bool:
    """Only CJK characters, kana, hangul syllables and full-width marks (，。、：“ is not one): each
    2 columns and one unit (`width`, `voxgate.text.count_units`), no need to count them."""
    return _WIDE_UNITS.fullmatch(text) is not None


def width(text: str) -> int:
    """Display columns: a CJK character or emoji counts 2 (about a syllable of speech)."""
    if text.isascii():
        return len(text)
    if _NARROW_OR_WIDE.fullmatch(text):  # Chinese with Latin words or quotes: count the wide characters in C
        return len(text) + len(_WIDE_CHAR.findall(text))
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def skip_space(text: str, i: int) -> int:
    """The end of the whitespace run at `i`."""
    return _skip(text, i, None)


def _skip(text: str, i: int, chars: str | None) -> int:
    """The end of the run at `i` of characters in `chars` (None: whitespace)."""
    while i < len(text) and (text[i].isspace() if chars is None else text[i] in chars):
        i += 1
    return i


# ---------------------------------------------------------------------------- spans

LATER = -2  # `_span_end`: no closer within reach, but one may still come before the span's limit


class ScanState(NamedTuple):
    """What the scan carries from one call to the next besides where it stopped."""

    fenced: bool = False  # inside a ``` code block
    guards: tuple[int, ...] = ()  # openers of spans whose closer has not come (innermost last)
    held: tuple[tuple[Cut, tuple[int, ...]], ...] = ()  # boundaries awaiting the verdict of the spans open there


START = ScanState()
_MAX_GUARDS = 3  # long spans open at once: a deeper opener is plain text (hostile "((((((" costs nothing)


def _closer_pattern(closers: str) -> re.Pattern[str]:
    return re.compile("[" + re.escape(closers) + "\n]")  # a line break ends the search


_BRACKET_CLOSE = {opener: _closer_pattern(closers) for opener, closers in _BRACKETS.items()}
_QUOTATION_CLOSE = {opener: _closer_pattern(closer) for opener, closer in _QUOTATIONS.items()}
_QUOTE_CLOSE = {opener: _closer_pattern(closer) for opener, closer in _QUOTES.items()}


def _missing(n: int, limit: int, upto: int, final: bool) -> int | None:
    """No closer in the text searched (up to `upto` and the span's `limit`): undecided if the
    text has not reached that far, -1 if no closer can come any more, else LATER."""
    end = min(limit, upto)
    if end > n:
        return -1 if final else None
    return -1 if end == limit else LATER


def _closing(text: str, pattern: re.Pattern[str], frm: int, limit: int, upto: int, final: bool) -> int | None:
    """The end of the first closer in text[frm:min(limit, upto)] (a line break: -1)."""
    end = min(limit, upto)
    found = pattern.search(text, frm, min(end, len(text)))
    if found is not None:
        return -1 if found.group() == "\n" else found.end()
    return _missing(len(text), limit, upto, final)


def _token(text: str, token: str, frm: int, limit: int, upto: int, final: bool) -> int | None:
    """The end of the first `token` (``**``) in text[frm:min(limit, upto)]."""
    end = min(limit, upto)
    found = text.find(token, frm, end)
    return found + len(token) if found >= 0 else _missing(len(text), limit, upto, final)


_TICK_RUNS = {1: re.compile("(?<!`)`(?!`)"), 2: re.compile("(?<!`)``(?!`)")}  # a run of exactly that many


def _ticks(text: str, ticks: int, frm: int, limit: int, upto: int, final: bool) -> int | None:
    """The end of the first run of exactly `ticks` backticks in text[frm:min(limit, upto)] (not
    the start of a fence: a run at the end of the text may still grow)."""
    end, n = min(limit, upto), len(text)
    found = _TICK_RUNS[ticks].search(text, frm, min(end + 1, n))
    if found is not None and found.end() <= end:
        return None if found.end() == n and not final else found.end()
    return _missing(n, limit, upto, final)


def _span_end(text: str, i: int, final: bool, cap: int, upto: int) -> int | None:
    """The end of the protected span opening at `i` if its closer ends by `upto`; -1 if none
    opens there (or its closer cannot come within the span's limit), LATER if it may still
    come after `upto`, None if the text so far cannot tell."""
    n, ch = len(text), text[i]
    if ch == "`":
        ticks = _skip(text, i, "`") - i
        if i + ticks == n and not final:
            return None
        if ticks >= 3:
            return -1  # a code fence (the scan steps over it)
        return _ticks(text, ticks, i + ticks, i + 2 * cap, upto, final)  # code runs longer (a shell line)
    if ch == "*":
        if i + 2 >= n:
            return -1 if final else None
        if text[i + 1] != "*" or text[i + 2].isspace() or (i > 0 and text[i - 1].isascii() and text[i - 1].isalnum()):
            return -1  # a lone star, or 2**8
        return _token(text, "**", i + 2, i + cap, upto, final)
    if ch in _BRACKETS:
        return _closing(text, _BRACKET_CLOSE[ch], i + 1, i + cap, upto, final)
    if ch in _QUOTATIONS:
        if ch == '"':
            if i + 1 == n:
                return -1 if final else None
            before = text[i - 1] if i else " "
            if text[i + 1].isspace() or not (before.isspace() or before in _OPENS_QUOTE or is_ideograph(before)):
                return -1  # a closing quote, or 12" (inches)
        return _closing(text, _QUOTATION_CLOSE[ch], i + 1, i + cap + cap // 3, upto, final)  # a message runs long
    return _closing(text, _QUOTE_CLOSE[ch], i + 1, i + _QUOTE_SPAN, upto, final)


@lru_cache(maxsize=8)
def _words(count: int) -> re.Pattern[str]:
    """`count` words, each complete (the character after it has come): a run of non-space
    characters ended by a space or a CJK character, or two CJK characters (about a word's
    syllables) with the marks after them (one where a non-CJK character follows)."""
    cjk, inner = IDEOGRAPH.pattern, IDEOGRAPH.pattern[1:-1]
    marks = re.escape(_MARKS)
    word = (
        f"(?:(?:{cjk}{cjk}|{cjk}(?=[^{inner}]))[{marks}]*(?:\\s+|(?=[^\\s{marks}]))|[^\\s{inner}]+(?:\\s+|(?={cjk})))"
    )
    return re.compile(f"{word}{{{count}}}")


def held_until(text: str, opener: int, p: int, cap: int, hold: int) -> int:
    """Where the closer of the span opened at `opener` must end to hold a boundary at `p`:
    within `hold` words after it (`_words`: two CJK characters count one) and `cap`
    characters; for code twice both (a command's words are longer than prose's)."""
    if text[opener] == "`":
        hold, cap = 2 * hold, 2 * cap
    found = _words(hold).match(text, p, p + cap)
    return p + cap if found is None else found.end()


def _alive(text: str, guards: tuple[int, ...], i: int, cap: int) -> tuple[int, ...]:
    """The guards whose span may still close after `i` (decided by the text before it alone)."""
    return tuple(g for g in guards if _span_end(text, g, True, cap, i) == LATER)


SPAN_OPENERS = "`*" + "".join(_BRACKETS) + "".join(_QUOTES) + "".join(_QUOTATIONS)
_CLOSING = frozenset(_CLOSERS + "`*}")  # characters that may close a span


# ---------------------------------------------------------------------------- the scan


_PLAIN = re.compile("[A-Za-z0-9]+")


def _verdict(text: str, guards: tuple[int, ...], p: int, final: bool, cap: int, hold: int) -> bool | None:
    """Whether a boundary at `p` lies inside a span open there that closes within its hold
    after it (True: no cut), not (False), or None if the text cannot tell yet."""
    undecided = False
    for opener in guards:
        end = _span_end(text, opener, final, cap, held_until(text, opener, p, cap, hold))
        if end is None:
            undecided = True
        elif end > p:
            return True
    return None if undecided else False


def scan(
    text: str, at: int, final: bool, cap: int, state: ScanState = START, judge_from: int = 0, hold: int = HOLD
) -> tuple[list[Cut], int, ScanState]:
    """Boundaries in text[at:], where the scan stopped
    (len(text), or the first place that later text could still change: resume there), and
    the state there (`state`: the state at `at`). A code block is cut only at its line
    breaks. Every span opener is a guard until its closer: a boundary within `hold` words
    before the closer (twice for code) is none, so a span that closes within `hold` words of
    its opener is whole. A boundary whose verdict waits for a closer is held (`state.held`)
    while the scan goes on: each push judges the text it brought, even when a span's verdict
    comes for many boundaries at once. Gaps between two CJK characters before `judge_from`
    are not judged (no cut): the caller knows no choice can take them, and judging one costs
    a jieba call."""
    n, cuts, i = len(text), [], at
    fenced, guards, held = state
    queue = list(held)
    while i < n:
        ch = text[i]
        run = _skip(text, i, "`") if ch == "`" else i
        if run - i >= 3:
            if run == n and not final:
                break
            i, fenced, guards = run, not fenced, ()
            continue
        if fenced:
            if ch == "`" and run == n and not final:
                break  # "`" may grow into the closing fence
            if not ch.isspace():
                i += 1
                continue
            end = _skip(text, i, None)
            if end == n and not final:
                break
            if end < n and "\n" in text[i:end]:
                guards = _add(Cut(end, Gap.SENTENCE), text, guards, queue, cuts, final, cap, hold)
            i = end
            continue
        if ch.isascii() and ch.isalnum():  # a Latin word or number: nothing in it is a boundary
            end = _PLAIN.match(text, i).end()
            if end == n and not final:
                i = n - 1  # the gap after its last character is not known yet
                break
            i = end
            continue
        found, after, closed = None, i + 1, False  # a boundary, and where the scan goes on
        if guards and ch in _CLOSING:  # a span may close here (the innermost first)
            end, k = None, len(guards)
            while k > 0 and (end := _span_end(text, guards[k - 1], final, cap, i + 2)) is not None and end <= i:
                k -= 1  # not here (closed before, or later, or never)
            if k > 0 and (end is None or (run == n and ch == "`" and not final)):
                break  # undecided, or ticks that may grow into a fence
            if k > 0:
                if end == n and not final:
                    break  # the gap after the span is not known yet
                guards, closed = guards[: k - 1], True
                if text[end - 1] in _CLOSERS and end < n and not text[end].isspace():
                    found = Cut(end, gap) if (gap := classify(text, end, end)) else None  # “可以。”然后
                after = end
        if not closed and ch in SPAN_OPENERS and (kind := _span_end(text, i, final, cap, i + 1)) != -1:
            if kind is None:
                break  # the character after it tells (a closing quote, 2**8, a fence)
            guards = _alive(text, guards, i, cap)
            if len(guards) < _MAX_GUARDS:
                guards += (i,)  # its closer decides the boundaries within `hold` words before it
            i = _skip(text, i, "`") if ch == "`" else i + 2 if ch == "*" else i + 1
            continue
        if closed:
            pass  # a span closed here: its boundary, if any, is added below
        elif ch.isspace():
            end = _skip(text, i, None)
            if end == n and not final:
                break
            gap = classify(text, i, end) if end < n else None
            if gap == Gap.WORD and not final and _pending_after_space(text, i, end):
                break  # what follows may still glue the next word to this one
            if (
                gap == Gap.SENTENCE
                and not final
                and end + 2 > n
                and _citation(text[max(i - LOOKBACK, 0) : i].rstrip(_TRAILING), text, end, True)
            ):
                break  # "Fed. R" may become "Fed. R. Civ."
            found, after = (None if gap is None else Cut(end, gap)), end
        elif ch in SENTENCE or ch in CLAUSE:
            end = _skip(text, _skip(text, i, _STOPS), _CLOSERS)
            if end == n and not final:
                break
            if end < n and not text[end].isspace() and (gap := classify(text, end, end)):
                found = Cut(end, gap)
            after = end
        else:
            if i + 1 == n and not final:
                break  # the gap after this character is not known yet
            if is_ideograph(ch):  # a run of CJK characters: the gaps inside it
                free = not (guards or queue)
                gaps: list[Cut] = cuts if free else []
                last, stopped = _cjk_run(text, i, final, gaps, judge_from)
                for cut in () if free else gaps:
                    guards = _add(cut, text, guards, queue, cuts, final, cap, hold)
                if stopped:
                    i = last
                    break
                after = last + 1
        if found is not None:
            if guards or queue:
                guards = _add(found, text, guards, queue, cuts, final, cap, hold)
            else:
                cuts.append(found)
        i = after
    if queue:
        held = _release(text, queue, cuts, final, cap, hold)
    elif held:
        held = ()
    if (fenced, guards, held) != state:
        state = ScanState(fenced, guards, held)
    return cuts, i, state


def _add(cut: Cut, text: str, guards: tuple[int, ...], queue: list, cuts: list[Cut], final: bool, cap: int,
         hold: int) -> tuple[int, ...]:  # fmt: skip
    """Add a boundary found with spans open (or boundaries held before it): kept, dropped, or
    held until the spans' verdict comes; the spans still open."""
    if guards:
        guards = _alive(text, guards, cut.pos, cap)
    if not queue:
        verdict = _verdict(text, guards, cut.pos, final, cap, hold) if guards else False
        if verdict is not None:
            if not verdict:
                cuts.append(cut)
            return guards
    queue.append((cut, guards))
    return guards


def _release(text: str, queue: list, cuts: list[Cut], final: bool, cap: int, hold: int) -> tuple:
    """Add the held boundaries whose verdict has come, in order; the rest stay held."""
    k = 0
    while k < len(queue):
        cut, guards = queue[k]
        verdict = _verdict(text, guards, cut.pos, final, cap, hold) if guards else False
        if verdict is None:
            break
        if not verdict:
            cuts.append(cut)
        k += 1
    return tuple(queue[k:])


def _cjk_run(text: str, i: int, final: bool, cuts: list[Cut], judge_from: int = 0) -> tuple[int, bool]:
    """Judge the gaps of the CJK run starting at `i` (from `judge_from`): (its last character,
    or where a gap is undecided, and whether the scan must stop there). The run's bounds and
    whether it has kana are found once here, not per gap."""
    end = _IDEOGRAPHS.match(text, i).end()
    first = max(i + 1, judge_from)
    if first >= end:
        return end - 1, end == len(text) and not final
    start = _IDEOGRAPHS_END.search(text, max(first - CJK_LEFT, 0), first).start()
    kana = _KANA.search(text, start, end) is not None
    n, inner = len(text), end - CJK_RIGHT  # gaps up to `inner`: the window lies inside the run, no mark near
    for q in range(first, end):
        left = q - CJK_LEFT if q - CJK_LEFT > start else start
        if q <= inner:
            verdict = _word_gap(text, q, left, q + CJK_RIGHT, kana, False)
        else:
            right = min(end, q + CJK_RIGHT)
            if not final and ((right == n and right < q + CJK_RIGHT) or q + 3 > n):
                return q - 1, True  # undecided: the characters after the gap have not all arrived
            verdict = _cjk_gap(text, q, left, right, kana)
        if verdict is not False:
            cuts.append(Cut(q, verdict))
    return end - 1, end == len(text) and not final


def _pending_after_space(text: str, i: int, end: int) -> bool:
    """The first characters after a space do not yet say whether a word gap is one: "5 p" may
    become "5 p.m.", "+" or "(" may open a number, "Acme I" may become "Acme Inc."."""
    if end + 1 >= len(text) and end < len(text) and text[end] in _NUMBER_PREFIX:
        return True
    n = len(text)
    if end + 6 > n and "et al.".startswith(text[end:]):
        return True  # "Wang e" may become "Wang et al."
    if text[i - 2 : i] == "et" and (i < 3 or text[i - 3].isspace()) and end + 3 > n and "al.".startswith(text[end:]):
        return True  # "Wang et a" may become "Wang et al."
    if text[end].isupper() and end + 2 > n:
        return True  # "Bright E" may become "Bright Electronics" (a name), or "Bright E." (not)
    letters = _LETTERS.match(text, end).group()
    if (
        end + len(letters) == n
        and (letters[:1].isupper() or letters in ("v", "vs"))
        and any(w.startswith(letters.lower()) for w in _AFTER_NAMES)
    ):
        return True  # "Inc" may still become "Inc.", "Smith v" "Smith v."
    if _NAME_PARTICLE_PREFIX.fullmatch(text, end) and _capitalised_word_before(text, i):
        return True  # "Treaty o" may become "Treaty of Versailles"
    tail = text[end : end + 5]
    return (
        text[i - 1 : i].isdigit()
        and not any(ch.isspace() for ch in tail)
        and any(form.startswith(tail.lower()) for form in ("a.m.", "p.m.", "am", "pm"))
    )


def _cjk_gap(text: str, p: int, left: int, right: int, kana: bool) -> Gap | bool:
    """What the gap before text[p] (two CJK characters meet, and the characters after it that
    decide it have arrived) is: a `Gap` or False (no cut). text[left:right] is the run's
    window around it (`CJK_LEFT` before, `CJK_RIGHT` after); `kana`: the run has kana."""
    n = len(text)
    if not _MARK_SET.isdisjoint(text[p + 1 : p + 3]):
        return False  # one or two characters left before a punctuation mark
    near = right - p <= 3  # the clause's end, if it is one, is read only this close
    ends_clause = near and right < n and (text[right] in _MARKS or unicodedata.category(text[right]) == "So")
    if ends_clause and right - p <= 2:
        return False  # or before an emoji, which ends a clause as a mark does ("笑死" | "我了😂")
    return _word_gap(text, p, left, right, kana, ends_clause)


def _word_gap(text: str, p: int, left: int, right: int, kana: bool, ends_clause: bool) -> Gap | bool:
    """`_cjk_gap` once no mark lies within two characters after the gap: where the words meet
    (`ends_clause`: within 3 characters of a clause's end)."""
    before, after = text[p - 1], text[p]
    if kana and _KANA.search(text, left, right):  # Japanese: where a particle meets the next word
        if not _HIRAGANA.match(before) or _HIRAGANA.match(after) or after == "ー" or before in "のとかおご":
            return False  # inside a word or a name: 関ヶ原の戦い, ふるさと納税, お願い
        if before in _JA_PARTICLES:
            return False if before in _JA_CASE and _JA_PREDICATE.match(text, p) else Gap.CHAR
        if p >= 2 and is_ideograph(text[p - 2]) and not _KANA.match(text[p - 2]):
            return False  # one kana between kanji: okurigana inside a compound (問い合わせ, 取り扱い)
        return Gap.LEXICAL
    if after in _ZH_PARTICLES:
        return False  # 的, 了, 吗 go with the word before them (whatever jieba says: a word's start or inside one)
    tagged = rjieba.tag(text[left:right])  # jieba's words (its cut's, ~1 us a window) with their parts of speech
    offset, target = 0, p - left
    for k, (word, tag) in enumerate(tagged):  # noqa: B007 (the word that reaches the gap is read after the loop)
        offset += len(word)
        if offset >= target:
            break
    else:
        return False
    if offset != target:
        return False  # inside a word
    following, next_tag = tagged[k + 1] if k + 1 < len(tagged) else ("", "")
    if following and following[0] in _ZH_PARTICLES:
        return False  # 的, 了, 吗 go with the word before them
    if word[-1] in _ZH_PARTICLES or following in _ZH_OPENERS:
        if word[-1] in "的地得" and ends_clause and right - p <= 3:
            return False  # a modifier keeps a short noun that ends the clause ("直立的" | "小尖角。")
        return Gap.CHAR
    previous = tagged[k - 1][1] if k else ""
    return Gap.LEXICAL if _phrase_break(word, tag, following, next_tag, previous) else False


def _phrase_break(word: str, tag: str, following: str, next_tag: str, previous: str) -> bool:
    """Whether two jieba words meet at a phrase boundary a listener accepts as a pause (the
    last-resort cut): after a verb ("办理" | "护照"), between a subject and its predicate
    ("国家统计局" | "发布", "这个问题" | "在", "航班" | "原定于"), after an interjection ("哈哈哈" |
    "笑"). Not inside a noun phrase, whatever modifies its noun ("日本" | "单次" | "旅游签证",
    "最低" | "还款额", "这" | "两款"), not after a word that leads the next (a preposition, an
    adverb, a conjunction, a modal: "比" | "睡眠", "不" | "知道", "可以" | "看到"), not after a
    one-character word (often a piece of a word jieba does not know: "起" | "售价"), and not
    before one that belongs to the word before it: a complement or an object ("笑" | "死", "帮" |
    "您", "跑" | "出来"), or a place word ("签收" | "后"). A verb after a quantity or a
    distinguishing word (`previous`) modifies a noun ("多次往返" | "商务签证"); after a compound
    noun jieba's "verb" is often the compound's last noun ("英国学生" | "签证"), so a subject
    needs no noun before it; between two nouns a "verb" and the noun after it make one compound
    noun ("研究生" "招生" | "办公室": an admissions office). Measured on the written corpus and on
    new sentences of each class (tests/unit/test_cuts.py): no split; Chinese and Japanese starters
    of the written corpus
    4 characters at the median as before, 15 at p90 (12 before: those cut a phrase)."""
    if tag in _ZH_INTERJECTIONS:
        return True
    if len(word) == 1 or next_tag == "f" or following in _ZH_COMPLEMENTS:
        return False
    if len(following) == 1 and next_tag != "p":
        return False
    if _verbal(tag):
        compound = previous.startswith("n") and next_tag.startswith("n")  # 研究生 招生 | 办公室: one noun
        return word not in _ZH_MODALS and not previous.startswith(("m", "q", "b")) and not compound
    subject = tag[:1] in ("n", "r", "t") or tag in ("zg", "j")
    predicate = _verbal(next_tag) or next_tag in ("p", "t") or (next_tag == "d" and tag not in _ZH_NAMES)
    return subject and predicate and not previous.startswith(("n", "m", "q", "b", "j"))


def _verbal(tag: str) -> bool:
    return (tag[:1] == "v" and tag != "vn") or tag in ("l", "i")  # verbs, idioms; not a verbal noun (旅游签证)


_ZH_NAMES = frozenset({"nr", "ns", "nt", "nz"})  # before an "adverb", a name is a modifier: "日本" | "单次"
_ZH_INTERJECTIONS = frozenset({"o", "e", "y"})  # jieba's tags: onomatopoeia, interjection, modal particle
_ZH_MODALS = frozenset("可以 需要 应该 能够 必须 愿意 可能 想要 打算 准备".split())  # noqa: SIM905  # lead a verb
_ZH_COMPLEMENTS = frozenset("出来 起来 过来 下去 上来 进去 回来 出去 下来 上去 回去 过去 清楚 明白 干净".split())  # noqa: SIM905


_LATIN_TAIL = re.compile(r"[A-Za-z0-9]+$")


def _latin_label(text: str, word_start: int, core: str, after: str) -> bool:
    """A half-width colon inside a Latin run set in CJK text ("按Ctrl+Shift+P输入Python: Select
    Interpreter", "点击File: Open"): a name the reader says whole, not a clause of the sentence. In
    Latin text the word before has a space before it ("Note: this"), and stays a cut."""
    if core[-1] != ":" or not (after.isascii() and after.isalpha()):
        return False
    run = _LATIN_TAIL.search(core, 0, len(core) - 1)  # the Latin name the colon ends
    start = word_start + run.start() if run else 0
    return start > 0 and is_ideograph(text[start - 1])


# ---------------------------------------------------------------------------- one gap


def classify(text: str, i: int, end: int) -> Gap | None:
    """What kind of boundary the gap text[i:end] (whitespace or nothing) is, if any."""
    if i == end and i > 1 and (mark := text[i - 1]) in _CJK_STOPS and _WORD_CHAR.match(text, i - 2):
        return Gap.CLAUSE if mark in CLAUSE else Gap.SENTENCE  # 字，字 (Chinese text's most common gap): as below
    spaced, after = i < end, text[end]
    word = _word_before(text, i)
    word_start = i - len(word)
    if not word:
        return None  # whitespace opening the stream
    if "\n" in text[i:end]:
        return Gap.SENTENCE
    core = word.rstrip(_TRAILING)
    if _list_marker(text, word_start, word, after):
        return None  # "1. " and "- " stay with their item
    if core and core[-1] in _STOPS:
        if not spaced and (core[-1] not in _FREE and not is_ideograph(after)):
            return None  # 3.14, 1,000, 12:30, example.com
        if not spaced and core[-2:-1].isdigit() and after.isdigit():
            return None  # 9：00
        if not speakable(core):
            return Gap.CLAUSE if core in _DASHES else None  # "like ! or #"
        if core[-1] in CLAUSE:
            if _latin_label(text, word_start, core, after):
                return None  # 输入Python: Select Interpreter (a menu command inside CJK text)
            return None if _date_comma(text, word_start, core, after) else Gap.CLAUSE
        if core[-1] != "." or core.endswith(".."):
            return Gap.SENTENCE
        if abbreviation_holds(core, after) or _citation(core, text, end):
            return None
        return Gap.SENTENCE
    if core in _DASHES:
        return Gap.CLAUSE
    if not spaced or is_ideograph(text[i - 1]) or is_ideograph(after) or after in _STOPS:
        return None
    if _number_follows(text, end) or after in _INFIX or (core and not core.strip(_OPERATORS)):
        return None  # "Python 3.10", "USD 1,299", "p = 0.31"
    if core[-1:].isdigit() and (after.isalpha() or after in "°%‰′″"):
        return None  # "149.6 million", "3 cloves", "5-7 business days", "180 °C"
    if (core == "et" and text.startswith("al.", end)) or text.startswith("et al.", end):
        return None  # "Wang et al."
    if _name_suffix(text, end):
        return None  # "Electronics Inc.", "Smith v. Jones"
    if (
        core[:1].isupper()
        and after.isupper()
        and core.isalpha()
        and len(name := text[end : end + 2]) == 2
        and name.isalpha()
    ):
        return None  # a name: "Bright Electronics", "Martin Luther King" (not "I" or "A")
    if core[:1].isupper() and core.isalpha() and len(core) > 1 and _NAME_PARTICLE.match(text, end):
        return None  # a name with a particle: "Treaty of Versailles", "Bank of America", "Leonardo da Vinci"
    if core.lower() in _HANGING:
        return None  # "the" | "museum", "to" | "the"
    if core[-1:].isdigit() and _CLOCK.match(text, end):
        return None
    clause = _clause_start(text, i, 24)
    if IDEOGRAPH.search(text, clause, i) or (clause > 0 and text[clause - 1] in "。！？，、；："):
        return None  # Latin terms inside Chinese text stay whole (Chinese earlier in the clause, or its mark)
    return Gap.WORD


_PARTICLES = ("of", "de", "du", "da", "del", "della", "der", "van", "von", "di", "le", "la")
_NAME_PARTICLE = re.compile(rf"(?:{'|'.join(_PARTICLES)})[ \t]+[A-Z]")
_NAME_PARTICLE_PREFIX = re.compile(  # the text so far could still become a particle and a name
    "|".join(sorted({p[:k] for p in _PARTICLES for k in range(1, len(p) + 1)}, key=len, reverse=True))
    + rf"|(?:{'|'.join(_PARTICLES)})[ \t]*"
)


def _capitalised_word_before(text: str, i: int) -> bool:
    word = _word_before(text, i)
    return len(word) > 1 and word[:1].isupper() and word.isalpha()


def _name_suffix(text: str, end: int) -> bool:
    """The next word is one written after a name, with its dot or comma: "Inc.", "Jr.,"."""
    if not ("A" <= text[end] <= "Z" or text[end] == "v"):
        return False  # most words: not capitalised, not "v." or "vs."
    letters = _LETTERS.match(text, end).group()
    follows = text[end + len(letters) : end + len(letters) + 1]
    return (
        (letters[:1].isupper() or letters in ("v", "vs")) and letters.lower() in _AFTER_NAMES and follows in (".", ",")
    )


def _date_comma(text: str, word_start: int, core: str, after: str) -> bool:
    """A comma inside a date: "June 28, 1919", "Thu., Oct. 10", "Friday, Nov. 28"."""
    if core[-1] != ",":
        return False
    token = core[:-1].rstrip(".").lower()
    if token in _DAYS:
        return after.isupper() or after.isdigit()
    before = text[max(word_start - 12, 0) : word_start].split()
    month = before[-1].rstrip(".").lower() if before else ""
    return token.isdigit() and len(token) <= 2 and month in _MONTHS and after.isdigit()


def _number_follows(text: str, end: int) -> bool:
    first = text[end]
    return first.isdigit() or (first in _NUMBER_PREFIX and text[end + 1 : end + 2].isdigit())


def _list_marker(text: str, word_start: int, word: str, after: str) -> bool:
    """A list marker: at the start of a line ("1. ", "- "), or inline after a colon, a comma
    or "or"/"and" ("options: 1. restart the router, or 2. reinstall"), or before a lower-case word."""
    if len(word) > 6:
        return False  # longer than any marker ("######", "(viii)")
    line = word_start
    while line > max(word_start - LOOKBACK, 0) and text[line - 1] in " \t":
        line -= 1
    if (line == 0 or text[line - 1] == "\n") and _LIST_MARKER.fullmatch(word):
        return True
    if not _INLINE_MARKER.fullmatch(word):
        return False
    if after.islower():
        return True
    before = text[max(line - 12, 0) : line].split()
    previous = before[-1] if before else ""
    return previous[-1:] in (":", ",", ";") or previous.lower() in ("or", "and", "then")


def _citation(core: str, text: str, end: int, maybe: bool = False) -> bool:
    """A capitalised abbreviation before an initial ("Fed. R. Civ. P."): a citation goes on.
    With `maybe`, whether it still could (the initial's dot has not arrived)."""
    found = _TAIL_WORD.search(core[:-1]) if core.endswith(".") else None
    if found is None or not found.group()[:1].isupper() or found.group().lower() not in _KNOWN:
        return False
    if not text[end : end + 1].isupper():
        return False
    return text[end + 1 : end + 2] == "." or (maybe and end + 1 >= len(text))


def abbreviation_holds(core: str, after: str) -> bool:
    """Whether "word." before `after` is an abbreviation that keeps the next word with it.
    When unsure it holds: a missed sentence end only makes a segment longer; a wrong one is
    a pause a listener hears. (The WebSocket gateway's session asks it too.)"""
    found = _TAIL_WORD.search(core[:-1])
    if found is None:
        return False
    token = found.group()
    lower = token.lower()
    if _MULTI_DOT.fullmatch(lower) or (len(token) == 1 and token.isupper()):
        return True  # "U.S.", "Ph.D.", "e.g.", "J. Doe"
    if lower in _TITLES:
        return True  # "Dr. Lee", "Sen. Warren"
    if after.isdigit():  # "No. 3", "Nov. 26", "Rte. 128", "Apt. 4"; an unknown short one capitalised ("Blk. 4"),
        # since a lower-case short word is far more often a sentence's last ("it left. 3 more came")
        short = token.isalpha() and len(token) <= 4 and not token.islower()
        return lower in _BEFORE_NUMBERS or lower in _KNOWN or short
    if lower not in _KNOWN:
        return False
    return after in "([（" or lower not in _WORDS or after.islower() or is_ideograph(after)  # "etc.我们" goes on
