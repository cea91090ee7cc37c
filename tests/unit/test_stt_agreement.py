"""LocalAgreement, the policy that commits what two consecutive partial hypotheses agree on."""

from __future__ import annotations

from voxgate.agent.stt import Word
from voxgate.agent.stt_stream import LocalAgreement, after_overlap, normalise


def hyp(*spec: tuple[str, float]) -> list[Word]:
    """Words with their start times; each ends where the next starts (or 0.3 s later)."""
    starts = [s for _, s in spec] + [spec[-1][1] + 0.3]
    return [Word(f" {w}", starts[i], starts[i + 1]) for i, (w, _) in enumerate(spec)]


def test_words_are_committed_only_once_two_hypotheses_agree_on_them():
    la = LocalAgreement()
    assert la.insert(hyp(("What", 0.0), ("is", 0.3))) == 0  # a first hypothesis commits nothing
    assert la.insert(hyp(("What", 0.0), ("is", 0.3), ("the", 0.5), ("tall", 0.7))) == 2
    assert [w.text for w in la.committed] == [" What", " is"]
    assert la.cut_s == 0.3  # the last committed word is decoded again, whole
    # the next hypothesis starts at the cut: its repeat of "is" is overlap, not a new word
    assert la.insert(hyp(("is", 0.3), ("the", 0.5), ("tallest", 0.7), ("mountain", 1.1))) == 1
    assert la.text() == "What is the tallest mountain"


def test_disagreement_commits_nothing_past_the_first_different_word():
    la = LocalAgreement()
    la.insert(hyp(("book", 0.0), ("a", 0.3), ("able", 0.4)))
    assert la.insert(hyp(("book", 0.0), ("a", 0.3), ("table", 0.4), ("for", 0.7))) == 2
    assert la.pending[0].text == " table"


def test_comparison_ignores_case_and_punctuation():
    assert normalise(" World?") == normalise("world") == "world"
    la = LocalAgreement()
    la.insert(hyp(("Hello,", 0.0), ("there.", 0.4)))
    assert la.insert(hyp(("hello", 0.0), ("there", 0.4), ("friend", 0.8))) == 2


def test_the_tail_is_joined_to_the_committed_words_without_repeating_them():
    la = LocalAgreement()
    la.insert(hyp(("take", 0.0), ("the", 0.3), ("train", 0.5)))
    la.insert(hyp(("take", 0.0), ("the", 0.3), ("train", 0.5), ("to", 0.9)))
    assert la.text("train to London.") == "take the train to London."  # the tail re-heard "train"
    assert la.text("to London.") == "take the train to London."
    assert la.text("") == "take the train"


def test_overlap_is_the_longest_repeat_of_the_committed_end_up_to_three_words():
    assert after_overlap([" a", " b", " c"], ["b", "c", "d"]) == ["d"]
    assert after_overlap([" a", " b"], ["x", "b"]) == ["x", "b"]  # only a leading repeat is overlap
    assert after_overlap([], ["a"]) == ["a"]
