"""Bounded holding (issue 18): a markup or quotation opener whose closer has not come holds a
cut for at most `HOLD` words (or CJK characters) past it, never the reply, and never the
starter beyond that. Streamed a character at a time; no timing: the text that had arrived when
each segment came out, against where it ends."""

from __future__ import annotations

import pytest

from voxgate.bridge.corpus import check_corpus, marked_reply
from voxgate.bridge.cuts import HOLD, START, is_ideograph, scan
from voxgate.bridge.segmenter import Segmenter
from voxgate.config import DEFAULT_STARTERS
from voxgate.text import count_units

SLACK = 2  # words the rules read past a boundary without any opener: the next word, a CJK window


def _words(text: str) -> int:
    """Words as the hold counts them: two CJK characters make one."""
    cjk = sum(map(is_ideograph, text))
    return count_units("".join(" " if is_ideograph(ch) else ch for ch in text)) + (cjk + 1) // 2


def _lags(text: str, openers: tuple[str, ...] = ()) -> list[tuple[str, int]]:
    """(segment, words or CJK characters that had arrived past its end when it came out) for
    every segment cut at a mark (a length cut, or the starter, is decided by text after it,
    by design)."""
    segmenter, out, end = Segmenter(openers=openers), [], 0
    for seen, ch in enumerate(text, 1):
        for segment in segmenter.push(ch):
            end += len(segment.raw)
            if segment.trigger == "punctuation":  # the starter's own look-ahead: `check_corpus`'s starter_late
                out.append((segment.text, _words(text[end:seen])))
    return out


_STRAY = [
    '"Whenever you feel like criticizing anyone, just remember that all the people in this world have not had '
    "the advantages that you have had, and think before you speak.",
    "Use 2**8 here, which is 256, and x**2 for squares; the table lists **every value from one to ten in order, "
    "with the square of each next to it, and the cube.",
    "(Note that the server restarts every night, so save your work before you leave, and check the logs in the "
    "morning when you come back in.",
    "The range [0, 1 is what we want here, since every value below one counts, and the other values are dropped "
    "before the next step runs.",
    "Run `pip install voxgate and then start the server, which listens on port eight thousand by default, and "
    "open the page in a browser.",
    "“我以前不太擅长公开演讲，所以去年报了演讲培训班，现在已经能自如地做季度汇报了，同事们都说我进步很大，领导也表扬了我。",
    "他说（这个方案需要再讨论一下，因为预算还没有批下来，而且人手也不够，所以我们下周再开会决定吧。",
    "「我们明天一起去公园散步吧，天气预报说明天是晴天，温度也很合适，适合户外活动。",
]


@pytest.mark.parametrize("openers", [(), DEFAULT_STARTERS], ids=["no-openers", "openers"])
@pytest.mark.parametrize("text", _STRAY, ids=range(len(_STRAY)))
def test_an_unclosed_opener_holds_a_cut_for_a_few_words_at_most(text, openers):
    lags = _lags(text, openers)
    assert lags, "no segment came out before the end"
    report = check_corpus([marked_reply(text, "x")], seed=1, openers=openers)
    assert report["starter_late"] == 0, report["failures"]  # held no more than `HOLD` words past its decider
    hold = 2 * HOLD if "`" in text else HOLD  # inline code waits twice as many: a command's words are longer
    assert max(lag for _, lag in lags) <= hold + SLACK, lags


def test_the_starter_is_not_held_by_a_long_quotation_at_the_start():
    text = (
        "\"Whenever you feel like criticizing anyone, just remember that all the people in this world haven't had "
        "the advantages that you've had,\" my father told me once."
    )
    segmenter = Segmenter()
    seen = next(i for i in range(1, len(text) + 1) if segmenter.push(text[i - 1]))
    assert count_units(text[: seen - 1]) <= 4 + HOLD  # its 3 words and the next, then the hold: was 11 words


def test_a_closed_quotation_keeps_its_last_words_together():
    """A long quotation may be cut (it is speech), but never within its last `HOLD` words: what
    comes after the cut is more than a few words."""
    quote = "“what does success look like in the first ninety days, and who decides whether we got there?”"
    text = f"The question I always ask is {quote} and it works every time."
    closing = text.index("”") + 1
    segmenter = Segmenter()
    pieces = [s for ch in text for s in segmenter.push(ch)] + segmenter.flush()
    ends = [sum(len(s.raw) for s in pieces[: k + 1]) for k in range(len(pieces) - 1)]
    assert not [e for e in ends if e < closing and count_units(text[e:closing]) <= HOLD], [s.text for s in pieces]


def test_short_spans_stay_whole_as_before():
    for marked in (
        "He said ⟦“it works on 2024-05-01.”⟧ Then he left, and nobody saw him again until the following spring.",
        "Install it with ⟦`pip install -r requirements.txt`⟧ and then run the server again to check it.",
        "The word ⟦“加油”⟧ (jiāyóu) literally means add oil, and people shout it at sports games.",
        "Run ⟦`git clone git@github.com:example/voxgate.git`⟧ first, then open the folder in your editor.",
    ):
        for openers in ((), DEFAULT_STARTERS):
            report = check_corpus([marked_reply(marked, "en")], seed=3, openers=openers)
            assert report["protected_splits"] == 0, report["failures"]


@pytest.mark.parametrize(
    "text",
    [
        "Deductions (mortgage interest, state taxes up to $10,000, charity, and a few more things) add up to more.",
        '"Whenever you feel like criticizing anyone, just remember that all the people in this world" is a quote.',
        "他说（这个方案需要再讨论一下，因为预算还没有批下来，而且人手也不够，所以我们下周再开会决定吧。",
    ],
)
def test_the_scan_keeps_up_with_the_text_while_a_span_is_open(text):
    """The cost of a push does not depend on what came before: while a boundary waits for a
    closer's verdict (held), the scan goes on judging the text as it comes, so no push judges
    a span's worth of text at once when the verdict comes (before: the scan stood 37-63
    characters behind the text, at the held boundary or at the opener)."""
    state, at, behind = START, 0, 0
    for n in range(1, len(text) + 1):
        _, at, state = scan(text[:n], at, False, 48, state)
        behind = max(behind, n - at)
    assert behind <= 8  # a word or a CJK window still to come
    _, at, state = scan(text, at, True, 48, state)
    assert not state.held
