import pytest

from voxgate.bench.quality import word_error_rate


@pytest.mark.parametrize(
    ("ref", "hyp", "wer"),
    [
        ("the quick brown fox", "The quick, brown fox!", 0.0),
        ("the quick brown fox", "the quick fox", 0.25),
        ("the quick brown fox", "the quick brown red fox", 0.25),
        ("the quick brown fox", "a slow brown fox", 0.5),
        ("I have 3 cats", "I have three cats", 0.0),
        ("", "", 0.0),
    ],
)
def test_word_error_rate(ref, hyp, wer):
    assert word_error_rate(ref, hyp) == pytest.approx(wer)
