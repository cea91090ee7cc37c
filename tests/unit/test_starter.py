import numpy as np

from voxgate.speech.starter import StarterCache

AUDIO = np.ones(10, dtype=np.float32)


def _cache(*phrases: str) -> StarterCache:
    cache = StarterCache()
    for p in phrases:
        cache.add("v", p, AUDIO, 24000)
    return cache


def test_hit_returns_the_remainder_to_synthesise():
    hit = _cache("Sure.").match("v", "  Sure. I can help with that.")
    assert hit is not None and hit.phrase == "Sure." and hit.remainder == "I can help with that."


def test_longest_phrase_wins():
    hit = _cache("好", "好的").match("v", "好的，我们开始吧")
    assert hit is not None and hit.phrase == "好的" and hit.remainder == "，我们开始吧"


def test_word_boundary_is_respected():
    cache = _cache("Sure", "Okay, ")
    assert cache.match("v", "Surely not") is None
    assert cache.match("v", "Sure thing").remainder == "thing"
    assert cache.match("v", "Okay, go").phrase == "Okay,"


def test_whole_text_hit_has_empty_remainder():
    assert _cache("嗯").match("v", "嗯").remainder == ""


def test_other_voice_or_text_misses():
    cache = _cache("Sure.")
    assert cache.match("w", "Sure. yes") is None
    assert cache.match("v", "Not sure.") is None


def test_empty_phrase_or_audio_is_not_cached():
    cache = StarterCache()
    cache.add("v", "  ", AUDIO, 24000)
    cache.add("v", "Hi", np.zeros(0, dtype=np.float32), 24000)
    assert len(cache) == 0
