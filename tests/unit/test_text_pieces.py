"""Long text as bounded pieces: the pure splitter, piper's phoneme runs, and the engine
stream that speaks the pieces one after another as one stream."""

from __future__ import annotations

import asyncio
import itertools
import threading

import numpy as np
import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from voxgate.engines.base import collect, stream_pieces
from voxgate.engines.piper import split_runs
from voxgate.engines.tone import ToneEngine
from voxgate.speech.stream import EngineStream
from voxgate.speech.workers import EnginePool
from voxgate.text import Piece, count_units, split_pieces
from voxgate.types import AudioChunk, CancelToken, SynthesisRequest

FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one cluster of five code points
FLAG = "\U0001f1fa\U0001f1f8"  # two regional indicators, one cluster
PAIR = "\ud83d\ude00"  # a surrogate pair as two code points (unvalidated text)
CONJUNCT = "क्षि"  # Devanagari k+virama+ssa+i: one cluster of four code points


def texts(pieces: list[Piece]) -> list[str]:
    return [p.text for p in pieces]


# ---------------------------------------------------------------------- examples


def test_text_that_fits_is_one_piece_unchanged():
    assert split_pieces("  Hello there. ", 20) == [Piece(0, 15, "  Hello there. ", "end")]


def test_blank_text_has_no_pieces():
    assert split_pieces(" \n\t ", 10) == []


def test_every_cut_falls_between_clusters():
    for text in ["a" + FAMILY * 20, CONJUNCT * 20, "x" * 50 + FLAG * 20]:
        for limit in range(5, 15):
            boundaries = _boundaries(text)
            assert all(p.start in boundaries and p.end in boundaries for p in split_pieces(text, limit))


def test_a_sentence_end_wins_over_later_clause_and_word_ends():
    text = "One two. Three, four five six seven"
    assert texts(split_pieces(text, 20)) == ["One two.", "Three,", "four five six seven"]


def test_a_clause_end_wins_over_a_later_word_end():
    assert texts(split_pieces("alpha beta, gamma delta epsilon", 20)) == ["alpha beta,", "gamma delta epsilon"]


def test_cjk_punctuation_cuts_without_a_following_space():
    text = "你好世界。今天天气很好，我们去公园吧、好的"
    pieces = split_pieces(text, 8)
    assert texts(pieces) == ["你好世界。", "今天天气很好，", "我们去公园吧、", "好的"]
    assert [p.cut for p in pieces] == ["sentence", "clause", "clause", "end"]


def test_latin_punctuation_inside_a_token_is_not_a_cut():
    text = "pi is 3.14159 and 1,000,000 is big ok"
    assert all(p.cut in ("word", "end") for p in split_pieces(text, 16))


def test_closing_quotes_stay_with_their_sentence():
    assert texts(split_pieces('"Stop!" he said. Go now ok', 12))[:2] == ['"Stop!"', "he said."]


def test_a_run_without_spaces_is_cut_at_the_limit():
    pieces = split_pieces("x" * 1000, 400)
    assert [len(p.text) for p in pieces] == [400, 400, 200]
    assert [p.cut for p in pieces] == ["grapheme", "grapheme", "end"]


def test_cjk_without_punctuation_is_cut_between_characters():
    text = "我们今天去公园散步然后回家吃饭" * 40
    pieces = split_pieces(text, 100)
    assert "".join(texts(pieces)) == text and max(len(p.text) for p in pieces) == 100


@pytest.mark.parametrize("cluster", [FAMILY, FLAG, "e\u0301\u0327", CONJUNCT, "\u1100\u1161\u11a8", PAIR])
def test_no_cluster_or_surrogate_pair_is_split(cluster):
    text = "a" + cluster * 30  # the limit falls inside a cluster wherever it lands
    for limit in range(len(cluster) + 1, len(cluster) + 9):
        pieces = split_pieces(text, limit)
        assert "".join(texts(pieces)) == text
        assert all(p.text.lstrip("a").count(cluster) * len(cluster) == len(p.text.lstrip("a")) for p in pieces)


def test_a_cluster_longer_than_the_limit_is_cut_rather_than_sent_whole():
    pieces = split_pieces("e" + "\u0301" * 30, 10)
    assert max(len(p.text) for p in pieces) <= 10 and pieces[0].cut == "forced"


def test_the_limit_must_leave_room_for_a_surrogate_pair():
    with pytest.raises(ValueError):
        split_pieces("abc", 1)


# ---------------------------------------------------------------------- properties

_TOKENS = st.sampled_from(
    ["a", "word", "longerword", "3.14", "1,000", "你", "好", "。", "，", "、", "！", ".", ",", ";", ":", "!", "?", "—",
     "–", '"', ")", "」", " ", " ", " ", "\n", "\u3000", FAMILY, FLAG, CONJUNCT, "e\u0301", "\u1100\u1161", PAIR]
)  # fmt: skip
_TEXT = st.lists(_TOKENS, max_size=80).map("".join)

# Prose-like text for the preference property: cores, each with at most one mark (and a
# closing quote after some), so where a piece may end is simple to state independently.
_CORE = st.sampled_from(["a", "word", "3.14", "1,000", "你", "好", FAMILY, FLAG, CONJUNCT, "e\u0301", "x" * 12, PAIR])
_MARK = st.sampled_from(["", "", "", ".", "!", "?", "。", "！", ",", ";", ":", "，", "、", "—", "–"])
_SEGMENT = st.tuples(
    st.lists(_CORE, min_size=1, max_size=3).map("".join),
    _MARK,
    st.sampled_from(["", "", '"', ")", "」"]),
    st.sampled_from(["", " ", " ", "\n", "\u3000", "  "]),
).map(lambda t: t[0] + t[1] + (t[2] if t[1] not in ("", "—", "–") else "") + t[3])
_PROSE = st.lists(_SEGMENT, max_size=30).map("".join)
_SENTENCE_MARKS, _CLAUSE_MARKS, _NO_SPACE_NEEDED = ".!?。！", ",;:，、—–", "。！，、—"


def _boundaries(text: str) -> set[int]:
    """Grapheme-cluster boundaries of the whole text, minus those inside a surrogate pair."""
    ends = {m.end() for m in regex.finditer(r"\X", text)} | {0}
    return {i for i in ends if not (0 < i < len(text) and text[i - 1] == PAIR[0] and text[i] == PAIR[1])}


def _mark_ends(text: str, marks: str) -> set[int]:
    """Where a piece may end after one of `marks` (and its closing quote): anywhere after a CJK
    mark or an em dash, before whitespace after a Latin one."""
    ends = set()
    for i, ch in enumerate(text):
        if ch in marks:
            end = i + 2 if text[i + 1 : i + 2] in ('"', ")", "」") and i + 1 < len(text) else i + 1
            if ch in _NO_SPACE_NEEDED or text[end : end + 1].isspace():
                ends.add(end)
    return ends


def _word_ends(text: str) -> set[int]:
    return {i for i in range(1, len(text)) if text[i].isspace() and not text[i - 1].isspace()}


@settings(max_examples=400, deadline=None, derandomize=True)
@given(text=_TEXT, limit=st.integers(2, 30))
def test_pieces_rebuild_the_text_within_the_limit_without_blank_pieces(text, limit):
    pieces = split_pieces(text, limit)
    if not text.strip():
        assert pieces == []
        return
    if len(text) <= limit:
        assert texts(pieces) == [text]
        return
    assert text[: pieces[0].start].strip() == "" and text[pieces[-1].end :].strip() == ""
    for before, after in itertools.pairwise(pieces):
        assert before.end <= after.start and text[before.end : after.start].strip() == ""
    for piece in pieces:
        assert piece.text == text[piece.start : piece.end]
        assert 0 < len(piece.text) <= limit and piece.text.strip() == piece.text


@settings(max_examples=400, deadline=None, derandomize=True)
@given(text=_PROSE, limit=st.integers(2, 30))
def test_cuts_prefer_sentence_then_clause_then_word_then_cluster(text, limit):
    rank = {"sentence": 0, "clause": 1, "word": 2, "grapheme": 3, "forced": 4}
    anywhere = {i for i in range(len(text) + 1) if not (0 < i < len(text) and text[i - 1 : i + 1] == PAIR)}
    levels = [_mark_ends(text, _SENTENCE_MARKS), _mark_ends(text, _CLAUSE_MARKS), _word_ends(text), _boundaries(text),
              anywhere]  # fmt: skip
    for piece in split_pieces(text, limit)[:-1]:
        window = range(piece.start + 1, piece.start + limit + 1)
        best = next(level for level, ends in enumerate(levels) if any(i in ends for i in window))
        assert rank[piece.cut] == best and piece.end in levels[best], (piece, text)
        assert piece.end == max(i for i in window if i in levels[best])  # as long as it can be


@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=_TEXT, limit=st.integers(2, 30))
def test_no_cluster_is_split_unless_it_alone_exceeds_the_limit(text, limit):
    longest = max((len(m.group()) for m in regex.finditer(r"\X", text)), default=0)
    if longest <= limit:
        assert all(p.cut != "forced" for p in split_pieces(text, limit))


# ---------------------------------------------------------------------- piper's runs


def test_piper_runs_cut_after_a_clause_then_between_words():
    assert split_runs(list("ab cd, ef gh ij"), 7) == [list("ab cd,"), list("ef gh"), list("ij")]


def test_piper_runs_cut_a_long_word_but_not_before_a_combining_mark():
    runs = split_runs(list("abcd\u0303efgh"), 4)
    assert runs == [list("abc"), list("d\u0303ef"), list("gh")]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(phonemes=st.lists(st.sampled_from([*"aɪə ,;ˈ", "\u0303"]), max_size=120), limit=st.integers(2, 20))
def test_piper_runs_keep_every_phoneme_in_order_within_the_limit(phonemes, limit):
    runs = split_runs(phonemes, limit)
    assert all(0 < len(run) <= limit for run in runs)
    assert "".join("".join(run) for run in runs).replace(" ", "") == "".join(phonemes).replace(" ", "")


# ---------------------------------------------------------------------- the stream of pieces


class RecordingEngine(ToneEngine):
    """The tone engine, noting the text of every call (and whether that call was closed)."""

    def __init__(self, delay_ms: float = 0.0) -> None:
        super().__init__(unit_ms=20, delay_ms=delay_ms)
        self.calls: list[str] = []
        self.closed = 0
        self.lock = threading.Lock()

    def stream(self, request, cancel):
        with self.lock:
            self.calls.append(request.text)
        try:
            yield from super().stream(request, cancel)
        finally:
            with self.lock:
                self.closed += 1


WORDS = " ".join(f"w{i % 97}" for i in range(600))  # 3,000+ characters, no punctuation


def test_no_engine_call_gets_more_than_the_limit_and_the_audio_is_the_same():
    engine = RecordingEngine()
    request = SynthesisRequest(text=WORDS, voice="tone")
    pieced = collect(engine, request, max_piece_chars=100)
    assert len(engine.calls) > 1 and max(len(t) for t in engine.calls) <= 100
    assert " ".join(engine.calls) == WORDS
    whole = collect(ToneEngine(unit_ms=20), request, max_piece_chars=10_000)
    np.testing.assert_array_equal(pieced.samples, whole.samples)  # cuts between words keep every unit


def test_pieces_form_one_stream_with_the_requests_unit_ranges():
    engine = ToneEngine(unit_ms=20, units_per_chunk=3)
    text = "ab " * 50 + "x" * 130 + " end"  # the 130-character token is cut inside
    chunks = list(stream_pieces(engine, SynthesisRequest(text=text, voice="tone"), CancelToken(), 60))
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    starts, ends = [c.unit_start for c in chunks], [c.unit_end for c in chunks]
    assert starts == sorted(starts) and ends == sorted(ends) and starts[0] == 0
    assert ends[-1] == count_units(text)
    assert all(s < e or (s == e == 50) for s, e in zip(starts, ends, strict=True))  # the split token is unit 50


def test_text_that_fits_reaches_the_engine_unchanged():
    engine = RecordingEngine()
    collect(engine, SynthesisRequest(text="  Hello there. ", voice="tone"), max_piece_chars=400)
    assert engine.calls == ["  Hello there. "]


def test_cancel_stops_the_piece_in_progress_and_starts_no_other():
    async def main() -> tuple[RecordingEngine, int]:
        engine = RecordingEngine(delay_ms=5)
        stream = EngineStream(engine, SynthesisRequest(text=WORDS, voice="tone"), EnginePool(2), max_piece_chars=100)
        got = 0
        while got < 25 and await stream.next() is not None:
            got += 1
        stream.cancel("client_disconnect")
        assert await stream.next() is None
        for _ in range(200):
            await asyncio.sleep(0.01)
            if engine.closed == len(engine.calls):
                break
        return engine, got

    engine, got = asyncio.run(main())
    assert got == 25
    assert len(engine.calls) <= 2  # 25-27 units a piece: at most the second piece had begun, no third
    assert engine.closed == len(engine.calls)


def test_an_engine_stream_counts_one_first_chunk_for_the_whole_text():
    async def main() -> list[AudioChunk]:
        stream = EngineStream(ToneEngine(unit_ms=20), SynthesisRequest(text=WORDS, voice="tone"), EnginePool(1),
                              max_piece_chars=100)  # fmt: skip
        out = []
        while (chunk := await stream.next()) is not None:
            out.append(chunk)
        assert stream.exhausted and stream.generated == count_units(WORDS)
        return out

    chunks = asyncio.run(main())
    assert chunks[0].seq == 0 and sum(len(c.samples) for c in chunks) == count_units(WORDS) * 480


def test_cut_audio_shares_the_samples_by_bytes_and_keeps_them_all():
    from voxgate.speech.pieces import cut_audio

    pcm = bytes(range(200)) * 10  # 1,000 samples of 16-bit PCM
    pieces = cut_audio(pcm, 1000, 300)  # 150 samples a piece
    assert b"".join(p for p, _ in pieces) == pcm and [n for _, n in pieces] == [150] * 6 + [100]
    compressed = cut_audio(b"x" * 1000, 4410, 400)  # an encoder's bytes: shares as near as bytes say
    assert [len(p) for p, _ in compressed] == [400, 400, 200] and sum(n for _, n in compressed) == 4410
    assert cut_audio(b"ab", 1, 400) == [(b"ab", 1)]
