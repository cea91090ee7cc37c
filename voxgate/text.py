"""Text units: the counting unit shared by engines, the WebSocket gateway and load tests.

A unit is one CJK character (or other non-space-delimited script character), or one
whitespace-delimited word of Latin-like text with its trailing punctuation. Counting
units lets a client detect lost or duplicated text exactly.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from voxgate.types import EmptyText, InvalidRequest, TextTooLong

# CJK ideographs, kana, hangul and fullwidth punctuation count one unit per character.
_CJK = (
    "\u3000-\u303f"  # CJK punctuation
    "\u3040-\u30ff"  # kana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # ideographs
    "\uac00-\ud7af"  # hangul
    "\uff00-\uffef"  # fullwidth forms
)
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
    return sum(1 for _ in _UNIT_RE.finditer(text))


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
    """Reject text no engine should receive: empty, too long, or with control characters."""
    if not text.strip():
        raise EmptyText("text is empty")
    if len(text) > max_chars:
        raise TextTooLong(f"text has {len(text)} characters; the limit is {max_chars}")
    for i, ch in enumerate(text):
        if ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cs"):
            raise InvalidRequest(f"text contains the control character U+{ord(ch):04X} at offset {i}")
