import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voxgate.bridge.corpus import check_corpus, load_replies, make_replies, segment_stream, split_reply
from voxgate.bridge.segmenter import Segment, Segmenter, SegmenterConfig
from voxgate.config import DEFAULT_STARTERS

REPLIES = make_replies(n_en=30, n_zh=30, seed=7)


def _segments(text: str, sizes: tuple[int, ...] = (1,), config: SegmenterConfig | None = None) -> list[Segment]:
    return segment_stream(split_reply(text, sizes), config)


def _texts(text: str, sizes: tuple[int, ...] = (1,), config: SegmenterConfig | None = None) -> list[str]:
    return [s.text for s in _segments(text, sizes, config)]


def _cuts(segments: list[Segment]) -> list[int]:
    offsets, pos = [], 0
    for s in segments[:-1]:
        pos += len(s.raw)
        offsets.append(pos)
    return offsets


def _pushes(tokens: list[str]) -> list[list[str]]:
    """What each push of an LLM-like token stream returned, then what flush returned."""
    segmenter = Segmenter()
    out = [[s.text for s in segmenter.push(t)] for t in tokens]
    return [*out, [s.text for s in segmenter.flush()]]


# Rule 1: the starter


def test_english_starter_ends_at_the_first_comma():
    first = _segments("Sure, I can help with that right away.")[0]
    assert (first.text, first.kind, first.trigger, first.index) == ("Sure,", "starter", "starter", 0)


def test_english_starter_without_punctuation_is_three_words():
    assert _texts("The capital of France is Paris, of course.")[0] == "The capital"  # not after "of"


@pytest.mark.parametrize(
    ("text", "starter"),
    [
        ("好的，我来帮你看一下这个问题。", "好的，"),
        ("当然可以！我们现在开始。", "当然可以！"),
        ("我觉得这个问题可以从三个方面来理解。", "我觉得"),  # at a phrase boundary (这个 opens one)
        ("嗯。好的，没问题。", "嗯。好的，"),  # "嗯。" alone would be a 2-character fragment
    ],
)
def test_chinese_starter_is_two_to_six_characters_ending_at_punctuation_if_any(text, starter):
    assert _texts(text)[0] == starter


@pytest.mark.parametrize(
    ("text", "cost"),
    [
        ("Sure thing", 2 * 6),  # a Latin word costs starter_max_cjk (6)
        ("根据国家", 4 * 3),  # a CJK character costs starter_max_words (3)
        ("用Python写", 3 + 6 + 3),
        ("— !! 好 ・", 3),  # marks alone and a CJK mark cost nothing
        ("ＡＢ", 2 * 3),  # full-width letters are CJK units
        ("a_b __ x", 2 * 6),
        ("!" * 5000 + "a", 6),
    ],
)
def test_the_starter_cost_counts_spoken_units(text, cost):
    assert Segmenter().starter_cost(text) == cost


def test_starter_is_sent_as_soon_as_the_token_after_its_boundary_arrives():
    pushes = _pushes(["Sure", ",", " I", " can", " help", "."])
    assert pushes[:3] == [[], [], ["Sure,"]]
    assert _pushes(["好的", "，", "我", "来"])[:3] == [[], [], ["好的，"]]


def test_only_the_first_segment_is_a_starter_and_the_last_is_final():
    segments = _segments("Sure. The answer is four. It is simple. Anything else?")
    assert [s.kind for s in segments] == ["starter", "main", "main", "final"]
    assert [s.index for s in segments] == [0, 1, 2, 3]
    assert segments[-1].trigger == "flush"


def test_a_reply_that_fits_in_one_segment_is_final():
    assert [(s.text, s.kind) for s in _segments("Yes.")] == [("Yes.", "final")]


# Rule 2: main segments of 20-60 columns, no fragments


def test_main_segments_cut_at_clause_marks_once_twenty_columns_wide():
    text = "First, we need to install the package, then we configure it, and finally we run the tests."
    assert _texts(text, (3,)) == [
        "First,",
        "we need to install the package,",
        "then we configure it,",
        "and finally we run the tests.",
    ]


def test_short_clauses_are_merged_into_their_neighbour():
    segments = _segments("Well, yes, no, maybe, ok, fine, sure, right, good; go on then, friend.")
    assert all(len(s.text) >= 3 for s in segments[:-1])
    assert [s.text for s in segments[1:]] == ["yes, no, maybe, ok, fine,", "sure, right, good; go on then,", "friend."]


def test_chinese_clauses_join_until_ten_characters():
    text = "今天天气很好，我们出去走走，顺便买点水果，然后回家做饭。"
    assert _texts(text)[1:] == ["我们出去走走，顺便买点水果，", "然后回家做饭。"]


# Rule 3: sentence punctuation flushes at once


def test_sentence_end_flushes_at_the_next_token():
    pushes = _pushes(["Sure", ",", " the", " answer", " is", " four", ".", " It", " is", " simple", "."])
    assert pushes[6] == [] and pushes[7] == ["the answer is four."]
    assert _pushes(["好的", "，", "没", "问题", "。", "我们", "开始", "吧", "。"])[5] == ["没问题。"]


def test_sentence_end_takes_its_closing_quote():
    assert _texts('Okay. He said "it works." Then he left.') == ["Okay.", 'He said "it works."', "Then he left."]
    assert _texts("好的。他说：“可以。”然后就走了。") == ["好的。", "他说：“可以。”", "然后就走了。"]


def test_a_line_break_ends_a_segment_and_a_list_marker_stays_with_its_item():
    text = "Here are the steps:\n1. Install the package.\n2. Run it\n- check the logs"
    assert _texts(text)[1:] == ["are the steps:", "1. Install the package.", "2. Run it", "- check the logs"]


# Rule 4: length cuts


def test_latin_text_without_punctuation_is_cut_at_word_boundaries_within_sixty_columns():
    words = "there is no single right answer here but most teams start small and grow the system step by step"
    text = f"{words} {words} {words}"
    segments = _segments(text, (2,))
    assert {s.trigger for s in segments[1:-1]} == {"length"}
    assert all(20 <= len(s.text) <= 60 for s in segments[1:-1])
    assert " ".join(s.text for s in segments).split() == text.split()  # whole words only


def test_chinese_without_punctuation_is_cut_at_a_phrase_boundary_after_twelve_characters():
    text = "我觉得这个问题可以从三个不同的方面来进行深入的理解和分析"
    segments = _segments(text)
    assert [s.text for s in segments] == ["我觉得", "这个问题可以从三个不同的", "方面来进行深入的理解和分析"]
    assert [s.trigger for s in segments] == ["starter", "length", "flush"]


def test_thresholds_are_configurable():
    config = SegmenterConfig(starter_max_cjk=4, cjk_flush_units=4)
    assert _texts("我觉得这个问题可以从三个不同的方面来进行深入的理解", config=config) == [
        "我觉得",  # cuts between CJK characters fall at phrase boundaries, else word boundaries (jieba)
        "这个问题",
        "可以从三个不同的",
        "方面来进行深入的理解",
    ]
    with pytest.raises(ValueError):
        SegmenterConfig(main_min_width=80)


def test_length_cut_prefers_the_last_clause_mark():
    text = "Okay. To install it, run the command shown below and check that it all works."
    assert _texts(text)[1:] == ["To install it,", "run the command shown below and check that it all works."]


# Rule 5: protected patterns

_PROTECTED = [
    "3.14",
    "1,000,000",
    "-2.5e3",
    "2026-11-26",
    "12:30",
    "50%",
    "$1,299.99",
    "v2.0.1",
    "Mr. Smith",
    "Mrs. Jones",
    "Dr. Chen",
    "J. K. Rowling",
    "e.g.",
    "i.e.",
    "etc.",
    "U.S.",
    "vs.",
    "5 p.m.",
    "https://example.com/a/b.html?q=1&lang=en#top",
    "www.example.org/path",
    "alice.smith@example.com",
    "`pip install voxgate, then run it.`",
    "**very important, do not skip.**",
    "[the docs, part two](https://x.com/docs?a=1)",
    "👨‍👩‍👧‍👦",
    "👍🏽",
    "🏳️‍🌈",
    "🇨🇳",
]
_EN_FILLER = "so we keep talking about this topic for quite a while without any pause at all here"
_ZH_FILLER = "我们一直在讨论这个问题并且没有任何停顿的地方"


def _assert_never_cut_inside(text: str, start: int, end: int) -> None:
    for sizes in ((1,), (2, 5, 1), (len(text),)):
        cuts = _cuts(_segments(text, sizes))
        assert not [c for c in cuts if start < c < end], (text, sizes)


def test_the_second_segment_is_short_enough_to_be_ready_before_the_starter_ends():
    text = "The weather in Paris today is sunny and warm with a light breeze from the west, and it stays so."
    texts = _texts(text, (1,))
    assert texts[0] == "The weather"  # not "The weather in": no cut leaves a preposition hanging
    assert len(texts[1]) <= 40  # then full width again
    assert " ".join(texts) == text


def test_a_time_stays_with_its_number_however_the_text_arrives():
    text = "Okay. The train to the coast leaves every day at 5 p.m. from platform two, and at 9 am too."
    for sizes in ((1,), (2, 3), (len(text),)):
        joined = [s.raw for s in _segments(text, sizes)]
        assert not any(r.rstrip().endswith((" 5", " 9")) for r in joined), joined


@pytest.mark.parametrize("item", _PROTECTED)
def test_protected_pattern_is_never_split_in_english(item):
    words = _EN_FILLER.split()
    for k in range(len(words)):
        head = "Okay. " + " ".join(words[:k]) + (" " if k else "")
        text = f"{head}{item} {' '.join(words[k:])}. Then more text follows."
        _assert_never_cut_inside(text, len(head), len(head) + len(item))


@pytest.mark.parametrize("item", [*_PROTECTED, "PyTorch 2.1", " iPhone 15 Pro "])
def test_protected_pattern_is_never_split_in_chinese(item):
    for k in range(len(_ZH_FILLER)):
        head = "好的。" + _ZH_FILLER[:k]
        text = f"{head}{item}{_ZH_FILLER[k:]}。然后继续。"
        start = len(head) - 1 if k else len(head) + len(item) - len(item.lstrip())  # not even at its edges
        _assert_never_cut_inside(text, start, len(head) + len(item) + 1)


def test_sentence_punctuation_inside_protected_text_is_not_an_end():
    text = "Pi is about 3.14. Mr. Smith and Dr. Chen met at 5 p.m. in the U.S. on Friday, e.g. last week."
    assert _texts(text, (2,)) == [
        "Pi is about 3.14.",  # "Pi" is too short alone, "is" and "about" leave the phrase hanging
        "Mr. Smith and Dr. Chen met",
        "at 5 p.m. in the U.S. on Friday,",
        "e.g. last week.",
    ]


# Rule 6 and the streaming contract: raw text is kept exactly, whatever the deltas


@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(REPLIES) - 1), st.lists(st.integers(1, 8), min_size=1, max_size=40))
def test_corpus_replies_segment_identically_however_they_are_split(which, sizes):
    text = REPLIES[which].text
    segments = _segments(text, tuple(sizes))
    assert "".join(s.raw for s in segments) == text
    assert segments == _segments(text, (len(text),))
    assert all(s.text == s.raw.strip() and s.text for s in segments)


_PIECES = [
    "a", "word", " ", "  ", "\n", ".", ",", "!", "?", ":", ";", "-", "—", "3", "14", "e.g.", "Mr", "U.S.",
    "http://x.io/a", "@", "`", "*", "**", "[", "](", ")", '"', "”", "中", "文字", "。", "，", "、", "！",
    "🎉", "👍🏽", "\u200d", "Py", "1.", "…",
]  # fmt: skip


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_PIECES), max_size=60).map("".join), st.lists(st.integers(1, 6), min_size=1))
def test_any_text_is_kept_exactly_and_split_invariantly(text, sizes):
    segments = _segments(text, tuple(sizes))
    assert segments == _segments(text, (max(1, len(text)),))
    if text.strip():
        assert "".join(s.raw for s in segments) == text
    assert [s.index for s in segments] == list(range(len(segments)))
    assert all(len(s.text) >= 3 for s in segments if s.kind != "final")
    assert [s.kind for s in segments if s.kind == "final"] == (["final"] if segments else [])


def test_split_reply_cycles_through_chunk_sizes():
    assert split_reply("abcdefgh", [1, 3]) == ["a", "bcd", "e", "fgh"]
    assert "".join(split_reply("好的，我们开始吧。", [2])) == "好的，我们开始吧。"


def test_corpus_has_no_split_inside_protected_text_and_no_fragments():
    report = check_corpus()
    assert report["languages"] == {"en": 100, "zh": 100}
    assert report["protected_spans"] > 500
    assert report["protected_splits"] == 0
    assert report["short_segments"] == 0
    assert report["lost_or_duplicated"] == 0
    assert report["split_dependent"] == 0


# State


def test_reset_drops_the_pending_text():
    segmenter = Segmenter()
    segmenter.push("Sure, I was about to say")
    segmenter.reset()
    assert [s.text for s in segmenter.push("好的，") + segmenter.flush()] == ["好的，"]


def test_flush_ends_the_stream_and_the_segmenter_is_reusable():
    segmenter = Segmenter()
    assert [s.text for s in segmenter.push("Hello there, ") + segmenter.flush()] == ["Hello there,"]
    assert segmenter.flush() == [] and segmenter.push("   ") == [] and segmenter.flush() == []
    again = segmenter.push("Next reply, please.") + segmenter.flush()
    assert [(s.text, s.kind, s.index) for s in again] == [("Next reply,", "starter", 0), ("please.", "final", 1)]


# Cached openers (the starter cache): cut the moment the opener is complete


OPENERS = ["Sure,", "Sure.", "Okay, ", "好的，", "Hmm", "是。"]


def _opener_pushes(tokens: list[str], openers: list[str] = OPENERS) -> list[list[str]]:
    segmenter = Segmenter(openers=openers)
    return [[s.text for s in segmenter.push(t)] for t in tokens]


def test_a_cached_opener_is_the_starter_as_soon_as_its_last_character_arrives():
    assert _opener_pushes(["Sure", ",", " I", " can", " help"]) == [[], ["Sure,"], [], [], []]
    assert _pushes(["Sure", ",", " I", " can", " help"])[:3] == [[], [], ["Sure,"]]  # without: one token later
    assert _opener_pushes(["  Okay", ", let", " me"])[1] == ["Okay,"]
    assert _opener_pushes(["好的", "，", "我们"])[1] == ["好的，"]


def test_openers_apply_only_at_the_start_and_only_with_punctuation():
    assert _opener_pushes(["I am", " sure", ",", " yes"]) == [[], [], [], ["I am sure,"]]  # the usual rule
    assert _opener_pushes(["Hmm", " well"]) == [[], []]  # no punctuation: the usual rules decide
    assert _opener_pushes(["Hmm", ",", " well"]) == [[], ["Hmm,"], []]  # a bare phrase takes the mark after it
    assert _opener_pushes(["是", "。", "我"]) == [[], [], ["是。"]]  # shorter than min_chars: cached, so fine
    assert set(Segmenter(openers=OPENERS).openers) == {"Okay,", "好的，", "Sure,", "Sure.", "Hmm", "是。"}


def test_the_default_cjk_openers_open_a_reply_with_the_mark_after_them():
    """The default starter phrases "好的" and "嗯" have no mark of their own: a reply that opens
    with one and a mark gets it (with the mark) as its cached starter; a word that only begins
    with the same characters does not."""
    openers = list(DEFAULT_STARTERS)
    assert _opener_pushes(["嗯", "，", "我明白"], openers) == [[], ["嗯，"], []]
    assert _opener_pushes(["好的", "！", "我们"], openers) == [[], [], ["好的！"]]  # a sentence mark: one more char
    assert _opener_pushes(["好的东", "西很多，", "比如"], openers)[:2] == [[], []]  # not the opener "好的"
    whole = Segmenter(openers=openers)
    assert [s.text for s in whole.push("嗯")] == [] and [s.text for s in whole.flush()] == ["嗯"]


@settings(max_examples=100, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(REPLIES) - 1), st.sampled_from(["Sure, ", "Okay, ", "好的，"]),
       st.lists(st.integers(1, 8), min_size=1, max_size=40))  # fmt: skip
def test_replies_opening_with_a_cached_phrase_segment_identically_however_they_are_split(which, opener, sizes):
    text = opener + REPLIES[which].text
    segmenter = Segmenter(openers=OPENERS)
    pieces = split_reply(text, tuple(sizes))
    segments = [s for piece in pieces for s in segmenter.push(piece)] + segmenter.flush()
    whole = Segmenter(openers=OPENERS)
    assert segments == whole.push(text) + whole.flush()
    assert "".join(s.raw for s in segments) == text and segments[0].text == opener.strip()


@pytest.mark.parametrize(
    "config", [SegmenterConfig(), SegmenterConfig(main_min_width=8, second_max_width=6, cjk_flush_units=3)]
)
def test_leaving_unjudged_the_cjk_gaps_no_choice_can_take_changes_no_segment(config):
    """A main segment's first CJK gaps are not judged (a jieba call each, most of a push's cost):
    the segments are those of a segmenter that judges every gap, in Chinese, Japanese and mixed
    text, with and without punctuation, in pieces of 1-4 characters."""
    texts = [r.text for r in load_replies() if r.language in ("zh", "ja", "mixed")]
    texts.append("根据国家统计局发布的数据今年前三个季度全国居民人均可支配收入实际增长了百分之五点二" * 20)
    texts.append(
        "".join(ch + ("，" if k % 23 == 22 else "") for k, ch in enumerate("我们见面可以详细聊聊这个项目" * 30))
    )
    for text in texts:
        lean, thorough = Segmenter(config, DEFAULT_STARTERS), Segmenter(config, DEFAULT_STARTERS)
        thorough._blind = 0  # judges every gap
        deltas = split_reply(text, (1, 4, 2, 3))
        expected = [s for d in deltas for s in thorough.push(d)] + thorough.flush()
        assert [s for d in deltas for s in lean.push(d)] + lean.flush() == expected
