"""voxgate's LiveKit Agents TTS (`voxgate.integrations.livekit`) against a real `voxgate serve`
(tone engine) on a loopback port; LiveKit's own stream machinery, no LiveKit server."""

from __future__ import annotations

import asyncio
import logging
import secrets

import httpx
import numpy as np
import pytest
from livekit.agents import APIConnectOptions, APIStatusError, utils

from tests.conftest import LIMITS_KEYS, metric, tone_pcm, wait_for
from voxgate.integrations.livekit import TTS
from voxgate.integrations.wire import WordBuffer, pieces

UNIT_S = 0.12  # the tone engine speaks each unit for 120 ms
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
NO_RETRY = APIConnectOptions(max_retry=0, timeout=30)


def _run(coro, timeout: float = 120.0):
    async def main():
        async with utils.http_context.open():
            return await asyncio.wait_for(coro(), timeout)

    return asyncio.run(main())


def _pcm(frames) -> np.ndarray:
    return np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])


def _seconds(frames) -> float:
    return sum(f.samples_per_channel for f in frames) / frames[0].sample_rate


# ---------------------------------------------------------------------------- text, no server


def test_a_word_cut_by_a_delta_waits_for_its_end():
    words = WordBuffer()
    assert words.push("Hel") == ""
    assert words.push("lo wor") == "Hello "
    assert words.push("ld") == ""
    assert words.push(" ") == "world "
    assert words.push("  ") == ""  # spaces alone wait for a word
    assert words.push("你好") == "  你好"  # a CJK character is a whole unit
    assert words.push("a\x00b") == "a "  # a control character would be refused: it becomes a space
    assert words.drain() == "b"
    assert words.drain() == ""


def test_long_text_goes_out_in_pieces_cut_between_words():
    text = " ".join(f"word{i}" for i in range(200)) + " end."
    out = pieces(text, limit=50)
    assert "".join(out) == text
    assert all(len(p) <= 50 for p in out) and all(p.endswith(" ") for p in out[:-1])


# ---------------------------------------------------------------------------- a real server


def test_stream_speaks_words_as_they_come_before_the_input_ends(tone_server):
    async def speak():
        tts = TTS(base_url=tone_server.url, sample_rate=16000)
        async with tts.stream(conn_options=NO_RETRY) as stream:
            for i, word in enumerate(WORDS):  # as an LLM writes: a token per word, its space first
                stream.push_text(word if i == 0 else " " + word)
            first = await asyncio.wait_for(stream.__anext__(), 60)  # end_input() not called yet
            stream.end_input()
            return [first, *[event async for event in stream]]

    events = _run(speak)
    frames = [e.frame for e in events]
    assert {f.sample_rate for f in frames} == {16000} and {f.num_channels for f in frames} == {1}
    assert len({e.segment_id for e in events}) == 1 and events[-1].is_final
    # every word spoken: resampling each server segment may add or drop a few samples, and
    # LiveKit may close a segment with a 10 ms marker frame
    assert abs(_seconds(frames) - len(WORDS) * UNIT_S) < 0.03


def test_synthesize_gives_audio_at_the_asked_rate(tone_server):
    text = " ".join(WORDS)

    async def speak():
        tts = TTS(base_url=tone_server.url, sample_rate=22050)
        return [event.frame async for event in tts.synthesize(text, conn_options=NO_RETRY)]

    frames = _run(speak)
    assert {f.sample_rate for f in frames} == {22050}
    assert abs(_seconds(frames) - len(WORDS) * UNIT_S) < 0.03


def test_update_options_changes_the_voice_of_later_requests(tone_server):
    text = " ".join(WORDS)

    async def speak():
        tts = TTS(base_url=tone_server.url, voice="tone")
        tts.update_options(voice="tone-high")
        return [event.frame async for event in tts.synthesize(text, conn_options=NO_RETRY)]

    pcm = _pcm(_run(speak))
    assert np.array_equal(pcm, np.frombuffer(tone_pcm(text, "tone-high"), dtype=np.int16))


def test_closing_a_stream_mid_utterance_cancels_it_on_the_server(slow_server, caplog):
    """300 words take the slow tone engine 12 s; the stream is closed at its first audio."""
    words = [f"word{i}" for i in range(300)]
    caplog.set_level(logging.DEBUG, logger="voxgate.integrations.livekit")
    sessions = metric(slow_server, "voxgate_ws_sessions")

    async def abort():
        tts = TTS(base_url=slow_server.url, api_key=LIMITS_KEYS[0])
        stream = tts.stream(conn_options=NO_RETRY)
        stream.push_text(" ".join(words))
        stream.flush()
        first = await asyncio.wait_for(stream.__anext__(), 60)
        await stream.aclose()
        return first.request_id  # the voxgate session's id

    session_id = _run(abort)
    assert f"voxgate session {session_id}: utterance 0 cancelled" in caplog.text  # `cancel`, answered
    # The server dropped the session at once (a socket that just went away would leave it
    # waiting 30 s for a resume) ...
    assert wait_for(lambda: metric(slow_server, "voxgate_ws_sessions") <= sessions, timeout=10)
    # ... and sent no segment of the text's second half (it records each segment it starts sending)
    rows = httpx.get(f"{slow_server.url}/debug/timings", headers=slow_server.admin_headers()).json()["timings"]
    started = [int(r["request_id"].rsplit(":", 1)[1]) for r in rows if r["request_id"].startswith(session_id)]
    assert started and max(started) < len(words) // 2


def test_a_wrong_api_key_is_a_livekit_api_error_and_stays_out_of_the_logs(slow_server, caplog):
    key = "wrong-key-" + secrets.token_hex(8)
    caplog.set_level(logging.DEBUG)

    async def speak():
        tts = TTS(base_url=slow_server.url, api_key=key)
        return [event async for event in tts.synthesize("hello there", conn_options=NO_RETRY)]

    with pytest.raises(APIStatusError) as refused:
        _run(speak)
    assert refused.value.status_code == 401 and not refused.value.retryable
    for text in (str(refused.value), repr(refused.value), caplog.text, repr(TTS(api_key=key)._opts)):
        assert key not in text
    assert caplog.records  # the logs were captured: the check above saw them
