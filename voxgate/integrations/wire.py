"""What every framework integration needs of the gateway's wire (docs/protocol.md), without
I/O: the socket's address, and text cut the way the protocol takes it (whole units per delta,
each delta within a size)."""

from __future__ import annotations

from voxgate.text import is_cjk_char, speakable, split_units

WS_PATH = "/v1/tts/ws"
# A delta's longest text: well inside the protocol's 4,000 and a server's usual text limit. Tokens
# are far shorter; only text that waited for its turn, or a sentence-mode aggregate, is cut.
MAX_DELTA_CHARS = 1000


def socket_url(base_url: str) -> str:
    """The gateway's address from the server's: http(s)://host[:port][/v1] (or ws(s)://) ->
    ws(s)://host[:port]/v1/tts/ws; `ValueError` for any other scheme."""
    url = base_url.rstrip("/").removesuffix("/v1")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(plain):
            url = secure + url[len(plain) :]
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"base_url must be http(s):// or ws(s)://, got {base_url!r}")
    return url + WS_PATH


def whole_end(text: str) -> int:
    """Where the whole units of `text` end: a word still being written (a trailing run of
    non-space, non-CJK characters) waits for the next token to show whether it goes on."""
    units = split_units(text)
    last = units[-1] if units else None
    if last is not None and last.end == len(text) and not is_cjk_char(last.text):
        return last.start
    return len(text)


def pieces(text: str, limit: int = MAX_DELTA_CHARS) -> list[str]:
    """`text` as deltas of at most `limit` characters, cut before a unit (a word longer than
    `limit` is cut inside: the protocol's whole-unit rule cannot be kept for it)."""
    out = []
    while len(text) > limit:
        starts = [u.start for u in split_units(text[: limit + 1])][1:]  # each piece keeps a unit
        cut = starts[-1] if starts else limit
        out.append(text[:cut])
        text = text[cut:]
    return [*out, text]


class WordBuffer:
    """Deltas as the gateway takes them: whole units only (docs/protocol.md, Units). An LLM
    token can end inside a word ("Hel" + "lo"); the word is held until a space or a CJK
    character shows where it ends, or until the input is flushed."""

    def __init__(self, limit: int = MAX_DELTA_CHARS) -> None:
        self._held = ""
        self._limit = limit

    def push(self, text: str) -> str:
        """Text that may go out now (possibly empty)."""
        text = self._held + speakable(text)
        cut = whole_end(text)
        if len(text) - cut > self._limit:  # no word is this long: let it go as it is
            cut = len(text)
        if not text[:cut].strip():  # spaces alone say nothing: they go with the next word
            self._held = text
            return ""
        self._held = text[cut:]
        return text[:cut]

    def drain(self) -> str:
        """Whatever is held (the input is flushed or over)."""
        text, self._held = self._held, ""
        return text if text.strip() else ""
