"""Text units: the counting unit shared by engines, the WebSocket gateway and load tests.

A unit is one CJK character (or other non-space-delimited script character), or one
whitespace-delimited word of Latin-like text with its trailing punctuation. Counting
units lets a client detect lost or duplicated text exactly.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import regex

from voxgate.types import EmptyText, InvalidRequest, TextTooLong

# CJK ideographs, kana, hangul and fullwidth punctuation count one unit per character.
_CJK = (
    "\u3000-\u303f"  # CJK punctuation
    "\u3040-\u30ff"  # kana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # ideographs
    "\uac00-\ud7af"  # hangul
    "\uff00-\uffef"  # fullwidth forms
)
CJK = _CJK  # a regex character class's body: the characters that are one unit each
_UNIT_RE = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")


@dataclass(frozen=True, slots=True)
class Unit:
    index: int
    start: int  # character offset in the text, inclusive
    end: int  # exclusive
    text: str


def split_units(text: str) -> list[Unit]:
    """Split text into units, keeping character offsets."""
    return [Unit(i, m.start(), m.end(), m.group()) for i, m in enumerate(_UNIT_RE.finditer(text))]


def count_units(text: str) -> int:
    return len(_UNIT_RE.findall(text))


def is_cjk_char(ch: str) -> bool:
    return bool(re.fullmatch(f"[{_CJK}]", ch))


_LANGUAGE_NAMES = {
    "english": "en", "chinese": "zh", "mandarin": "zh", "japanese": "ja", "korean": "ko", "german": "de",
    "french": "fr", "russian": "ru", "portuguese": "pt", "spanish": "es", "italian": "it",
}  # fmt: skip


def normalize_language(language: str | None) -> str | None:
    """'English', 'en', 'en-US', 'en_us' -> 'en'; None or 'auto' -> None (engine decides)."""
    if language is None:
        return None
    key = language.strip().lower()
    if key in ("", "auto"):
        return None
    if key in _LANGUAGE_NAMES:
        return _LANGUAGE_NAMES[key]
    return re.split(r"[-_]", key, maxsplit=1)[0]


def check_text(text: str, max_chars: int) -> None:
    """Reject text no engine should receive: empty, too long, with control characters, or with
    nothing to say (a request for "." would get no audio at all)."""
    if not text.strip():
        raise EmptyText("text is empty")
    if len(text) > max_chars:
        raise TextTooLong(f"text has {len(text)} characters; the limit is {max_chars}")
    check_characters(text)
    if not says_something(text):
        raise EmptyText("text has nothing to speak: it has no letter or digit, only punctuation or symbols")


_LETTER_OR_DIGIT = re.compile(r"[^\W_]")  # str.isalnum's characters (\w less "_"), searched in C


def says_something(text: str) -> bool:
    """Whether text has anything to say: a letter or a digit, not only punctuation, emoji or
    markup. The one test of it: a one-shot request without it is refused (`check_text`), and
    the bridge's segmenter does not voice a segment without it (Piper voices "." and "?!" as
    no audio at all, "#" and emoji as their names)."""
    return _LETTER_OR_DIGIT.search(text) is not None


_UNSPEAKABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def speakable(text: str) -> str:
    """Text from a source that cannot be refused (an LLM's reply) with what `check_characters`
    refuses replaced by spaces, so it can be spoken."""
    return _UNSPEAKABLE.sub(" ", text)


def check_characters(text: str) -> None:
    """Reject control characters (Unicode category Cc, but tab and newlines) and lone surrogates
    (Cs): an engine cannot speak them and some (NUL) break engines' text front-ends. One regex
    scan (C speed: a 4,000-character delta costs microseconds, not the 0.6 ms of a Python loop)."""
    if (bad := _UNSPEAKABLE.search(text)) is not None:
        raise InvalidRequest(f"text contains the control character U+{ord(bad.group()):04X} at offset {bad.start()}")


# ---------------------------------------------------------------------------- pieces

# Where a long text may be cut, best first. Latin punctuation counts only before whitespace
# ("3.14", "1,000", "e.g.x" are not cuts); CJK punctuation needs no space after it. Closing
# quotes and brackets stay with the punctuation they close.
_CLOSERS = "\"'”’)\\]}»」』）】〉》"
_SENTENCE_END = re.compile(rf"[.!?…]+[{_CLOSERS}]*(?=\s)|[。！？｡]+[{_CLOSERS}]*")
_CLAUSE_END = re.compile(rf"[,;:]+[{_CLOSERS}]*(?=\s)|–(?=\s)|—+|[，；：、､]+[{_CLOSERS}]*")
_WORD_END = re.compile(r"\S(?=\s)")
_NON_SPACE = re.compile(r"\S")
_GRAPHEME = regex.compile(r"\X")


@dataclass(frozen=True, slots=True)
class Piece:
    """`text[start:end]`, and how it ends: at a `sentence` or `clause` end, between words
    (`word`), between grapheme clusters (`grapheme`), inside a cluster longer than the limit
    (`forced`), or at the end of the text (`end`)."""

    start: int
    end: int
    text: str
    cut: str


def split_pieces(text: str, max_chars: int) -> list[Piece]:
    """Cut `text` into pieces of at most `max_chars` characters, for engines whose memory and
    time per call grow with the text (Piper's VITS on 4,096 characters without a full stop
    peaked at 6.5 GB and held the CPU for a minute).

    Text that fits is one piece, as is, so short requests reach the engine unchanged. Longer
    text is cut greedily, each piece as long as it can be, at the last sentence end that fits,
    else the last clause end, else the last word end, else the last grapheme-cluster boundary
    (a run with no whitespace: CJK without punctuation, a URL, a 1,000-character token); the
    whitespace around a cut belongs to no piece, so no piece is empty or blank. A cluster is
    cut only when it alone exceeds `max_chars` (no script needs that many marks on one
    letter), and never between the two halves of a surrogate pair.

    Cluster boundaries come from the `regex` module's `\\X` (Unicode's UAX #29 rules: emoji ZWJ
    sequences, flag pairs, Hangul syllables, Indic conjuncts): the standard library has no
    grapheme-break data, and an approximation from character categories splits conjuncts.
    """
    if max_chars < 2:
        raise ValueError(f"max_chars must be at least 2, got {max_chars}")
    if not text.strip():
        return []
    if len(text) <= max_chars:
        return [Piece(0, len(text), text, "end")]
    levels = [(kind, [m.end() for m in pattern.finditer(text)]) for kind, pattern in _CUT_LEVELS]
    pieces: list[Piece] = []
    start, stop = _next_non_space(text, 0), len(text.rstrip())
    while stop - start > max_chars:
        end, cut = _best_cut(text, start, start + max_chars, levels)
        pieces.append(Piece(start, end, text[start:end], cut))
        start = _next_non_space(text, end)
    pieces.append(Piece(start, stop, text[start:stop], "end"))
    return pieces


_CUT_LEVELS = (("sentence", _SENTENCE_END), ("clause", _CLAUSE_END), ("word", _WORD_END))


def _best_cut(text: str, start: int, limit: int, levels: list[tuple[str, list[int]]]) -> tuple[int, str]:
    """The end of the piece starting at `start` (a non-space): the last cut of the best kind in
    `(start, limit]`."""
    for kind, ends in levels:
        i = bisect.bisect_right(ends, limit) - 1
        if i >= 0 and ends[i] > start:
            return ends[i], kind
    boundary = _last_grapheme_boundary(text, start, limit)
    if boundary is not None:
        return boundary, "grapheme"
    return (limit - 1 if _splits_surrogates(text, limit) else limit), "forced"


def _last_grapheme_boundary(text: str, start: int, limit: int) -> int | None:
    """The last grapheme-cluster boundary in `(start, limit]` that splits no surrogate pair."""
    best = None
    for match in _GRAPHEME.finditer(text, start):
        if match.end() > limit:
            break
        if not _splits_surrogates(text, match.end()):
            best = match.end()
    return best


def _splits_surrogates(text: str, at: int) -> bool:
    """Whether cutting before `text[at]` separates a high surrogate from its low one (only
    unvalidated text has surrogates: `check_text` refuses them)."""
    return 0 < at < len(text) and "\ud800" <= text[at - 1] <= "\udbff" and "\udc00" <= text[at] <= "\udfff"


def _next_non_space(text: str, at: int) -> int:
    match = _NON_SPACE.search(text, at)
    return match.start() if match else len(text)


# The scripts a language is written in, for voices that can read no other (a phonemizer per
# language: piper's espeak voices spell out a foreign letter's name instead). Languages not here
# are not checked.
_LATIN = ("Latin",)
LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    **{code: _LATIN for code in ("en", "de", "fr", "es", "it", "pt", "nl", "pl", "cs", "sk", "sl", "hr", "sv", "da",
                                 "no", "nb", "nn", "fi", "is", "et", "lv", "lt", "hu", "ro", "ca", "eu", "gl", "cy",
                                 "ga", "lb", "mt", "tr", "az", "sw", "vi", "id", "ms", "af", "sq", "eo", "la")},
    **{code: ("Cyrillic",) for code in ("ru", "uk", "bg", "be", "sr", "mk", "kk", "ky", "mn")},
    "el": ("Greek",), "he": ("Hebrew",), "ar": ("Arabic",), "fa": ("Arabic",), "ur": ("Arabic",),
    "hi": ("Devanagari",), "ne": ("Devanagari",), "mr": ("Devanagari",), "bn": ("Bengali",), "ta": ("Tamil",),
    "te": ("Telugu",), "ka": ("Georgian",), "hy": ("Armenian",), "th": ("Thai",), "zh": ("Han",),
    "ja": ("Han", "Hiragana", "Katakana"), "ko": ("Hangul", "Han"),
}  # fmt: skip
_SCRIPT_NAMES = sorted({s for scripts in LANGUAGE_SCRIPTS.values() for s in scripts})
_SCRIPT_RE = {name: regex.compile(rf"\p{{Script={name}}}") for name in _SCRIPT_NAMES}
_LETTER_RE = regex.compile(r"\p{L}")


def foreign_script(text: str, language: str) -> str | None:
    """The script most of `text`'s letters are written in, when `language` is not written in
    it and fewer than half of the letters are in the language's own scripts (a Chinese name in
    an English sentence passes); None otherwise, or for a language `LANGUAGE_SCRIPTS` lacks."""
    own = LANGUAGE_SCRIPTS.get(normalize_language(language) or "")
    letters = len(_LETTER_RE.findall(text))
    if own is None or letters == 0:
        return None
    if 2 * sum(len(_SCRIPT_RE[name].findall(text)) for name in own) >= letters:
        return None
    counts = {name: len(pattern.findall(text)) for name, pattern in _SCRIPT_RE.items() if name not in own}
    script, most = max(counts.items(), key=lambda kv: kv[1])
    return script if most else None
