import pytest

from voxgate.text import count_units, normalize_language, split_units


def test_latin_units_are_words_with_their_punctuation():
    units = split_units("Hello, world!  How are you?")
    assert [u.text for u in units] == ["Hello,", "world!", "How", "are", "you?"]
    assert [u.index for u in units] == [0, 1, 2, 3, 4]
    assert units[1].start == 7 and units[1].end == 13


def test_cjk_units_are_characters_and_mix_with_words():
    assert [u.text for u in split_units("你好，world 吗")] == ["你", "好", "，", "world", "吗"]
    assert count_units("こんにちは") == 5


def test_whitespace_has_no_units():
    assert split_units(" \n\t ") == []


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("English", "en"),
        ("en", "en"),
        ("en-US", "en"),
        ("zh_CN", "zh"),
        ("Chinese", "zh"),
        ("auto", None),
        (None, None),
    ],
)
def test_normalize_language(given, expected):
    assert normalize_language(given) == expected


def test_speakable_replaces_exactly_what_check_characters_refuses():
    import unicodedata

    from voxgate.text import check_characters, speakable

    refused = "".join(
        chr(c) for c in range(0x110000) if chr(c) not in "\t\n\r" and unicodedata.category(chr(c)) in ("Cc", "Cs")
    )
    assert speakable(refused) == " " * len(refused)
    kept = "Tab\tnew\nline\r 你好 🙂 e\u0301"
    assert speakable(kept) == kept
    check_characters(speakable("a\x00b\ud800c\x85d"))


def test_foreign_script_names_the_script_a_voice_cannot_read():
    from voxgate.text import foreign_script

    assert foreign_script("你好，世界。", "en") == "Han" and foreign_script("مرحبا بالعالم", "en-US") == "Arabic"
    assert foreign_script("Hello there.", "ru") == "Latin" and foreign_script("こんにちは", "en") == "Hiragana"
    for text, language in [("I met 王小明 in Beijing.", "en"), ("Café crème", "fr"), ("こんにちは世界", "ja"),
                           ("123, 456!", "en"), ("😀", "en"), ("", "en"), ("Hello", "xx"), ("你好", "zh")]:  # fmt: skip
        assert foreign_script(text, language) is None, (text, language)


@pytest.mark.parametrize("text", [".", "?!", "...", " — ", "🙂", "**", "$"])
def test_text_with_nothing_to_speak_is_refused_as_empty(text):
    from voxgate.text import check_text
    from voxgate.types import EmptyText

    with pytest.raises(EmptyText, match="nothing to speak"):
        check_text(text, 100)


@pytest.mark.parametrize("text", ["a.", "3", "你", "¿Qué?", "नमस्ते", "e\u0301"])
def test_text_with_a_letter_or_digit_is_spoken(text):
    from voxgate.text import check_text

    check_text(text, 100)
