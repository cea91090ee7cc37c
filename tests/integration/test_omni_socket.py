"""vLLM-Omni's streaming speech socket (`/v1/audio/speech/stream`) on a real server (tone
engine): every message and field vLLM-Omni's own example client reads
(`examples/online_serving/qwen3_tts/streaming_speech_client.py`: `audio.start` with
`sentence_index` and `sentence_text`, binary audio, `audio.done` with `sentence_index`,
`total_bytes` and `error`, `session.done` with `total_sentences` after each `input.done`),
with the session config it sends by default (voice "Vivian", task_type CustomVoice, language
"Auto", WAV, speed 1.0) and with `--stream-audio` (PCM as it is made)."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field

import av
import pytest
import websockets

from voxgate.bench.server import ServerProcess

CLIENT_DEFAULTS = {"voice": "Vivian", "task_type": "CustomVoice", "language": "Auto", "response_format": "wav",
                   "speed": 1.0}  # fmt: skip
TEXT = "Hello world. How are you today? I am fine, thank you."


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env={"TONE_DELAY_MS": "2", "MAX_STREAMS_PER_CLIENT": "64"}) as server:
        yield server


@dataclass
class Sentence:
    start: dict
    chunks: list[bytes] = field(default_factory=list)
    done: dict | None = None

    @property
    def audio(self) -> bytes:
        return b"".join(self.chunks)


@dataclass
class Utterance:
    sentences: list[Sentence] = field(default_factory=list)
    done: dict | None = None
    errors: list[dict] = field(default_factory=list)


async def _utterance(ws: websockets.ClientConnection, words: str) -> Utterance:
    """Send `words` one word per input.text (as the client's --simulate-stt), then input.done;
    read until session.done. Binary frames belong to the sentence last started."""
    for i, word in enumerate(words.split(" ")):
        await ws.send(json.dumps({"type": "input.text", "text": word + ("" if i == len(words.split()) - 1 else " ")}))
    await ws.send(json.dumps({"type": "input.done"}))
    out = Utterance()
    while True:
        frame = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(frame, bytes):
            assert out.sentences and out.sentences[-1].done is None, "audio outside a sentence"
            out.sentences[-1].chunks.append(frame)
            continue
        message = json.loads(frame)
        if message["type"] == "audio.start":
            out.sentences.append(Sentence(message))
        elif message["type"] == "audio.done":
            assert (
                out.sentences[-1].done is None
                and message["sentence_index"] == out.sentences[-1].start["sentence_index"]
            )
            out.sentences[-1].done = message
        elif message["type"] == "session.done":
            out.done = message
            return out
        elif message["type"] == "error":
            out.errors.append(message)
        else:
            raise AssertionError(f"vLLM-Omni's server sends no {message['type']!r}")


def _url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def _is_done(frame: str | bytes) -> bool:
    return isinstance(frame, str) and json.loads(frame)["type"] == "session.done"


def _wav(data: bytes) -> tuple[int, int, int, int]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()


def test_the_example_clients_defaults_get_one_wav_per_sentence_and_the_socket_serves_the_next_utterance(server):
    async def run() -> tuple[Utterance, Utterance, int | None]:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", **CLIENT_DEFAULTS}))
            first = await _utterance(ws, TEXT)
            second = await _utterance(ws, "And one more sentence.")
            await ws.send(json.dumps({"type": "session.close"}))
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 30)
            return first, second, ws.close_code

    first, second, code = asyncio.run(run())
    assert code == 1000 and not first.errors and not second.errors
    for number, utterance in enumerate((first, second)):
        assert [s.start["sentence_index"] for s in utterance.sentences] == list(range(len(utterance.sentences)))
        assert utterance.done == {"type": "session.done", "utterance_index": number,
                                  "total_sentences": len(utterance.sentences)}  # fmt: skip
        for s in utterance.sentences:
            assert s.start["utterance_index"] == number and s.start["format"] == "wav"
            assert len(s.chunks) == 1, "a whole WAV file per sentence"
            index = s.start["sentence_index"]
            assert s.done == {"type": "audio.done", "utterance_index": number, "sentence_index": index,
                              "total_bytes": len(s.audio), "error": False}  # fmt: skip
            rate, channels, width, frames = _wav(s.audio)
            assert (rate, channels, width) == (24000, 1, 2) and frames > 0
            assert len(s.audio) == 44 + 2 * frames  # exact sizes in the header
    assert [s.start["sentence_text"] for s in first.sentences] == [TEXT]  # 0.30.0's default: one per input.done


@pytest.mark.parametrize("granularity", ["sentence", "clause"])
def test_split_granularity_speaks_sentence_by_sentence_as_the_text_comes(server, granularity):
    async def run() -> Utterance:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", **CLIENT_DEFAULTS, "split_granularity": granularity}))
            return await _utterance(ws, TEXT)

    utterance = asyncio.run(run())
    said = " ".join(s.start["sentence_text"] for s in utterance.sentences)
    assert said.split() == TEXT.split()  # each sentence's text, in order, nothing lost or repeated
    assert len(utterance.sentences) >= 3 and utterance.done["total_sentences"] == len(utterance.sentences)


def test_stream_audio_sends_pcm_as_it_is_made_and_says_its_rate(server):
    async def run() -> Utterance:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", **CLIENT_DEFAULTS, "response_format": "pcm",
                                      "stream_audio": True}))  # fmt: skip
            return await _utterance(ws, "One two three four five six seven eight nine ten eleven twelve thirteen.")

    utterance = asyncio.run(run())
    assert not utterance.errors and utterance.sentences
    for s in utterance.sentences:
        assert s.start["sample_rate"] == 24000 and s.start["channels"] == 1 and s.start["format"] == "pcm"
        assert s.done["total_bytes"] == len(s.audio) > 0 and len(s.audio) % 2 == 0
    assert max(len(s.chunks) for s in utterance.sentences) > 1  # pieces as they come, not one file


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "aac"])
def test_compressed_formats_are_whole_files_that_decode(server, fmt):
    async def run() -> Utterance:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", **CLIENT_DEFAULTS, "response_format": fmt}))
            return await _utterance(ws, "Compressed audio, one file per sentence.")

    utterance = asyncio.run(run())
    assert not utterance.errors and utterance.sentences
    for s in utterance.sentences:
        assert s.start["format"] == fmt and s.done["total_bytes"] == len(s.audio) > 0
        with av.open(io.BytesIO(s.audio)) as container:
            decoded = sum(frame.samples for frame in container.decode(audio=0))
            rate = container.streams.audio[0].rate
        expected = {"opus": 48000}.get(fmt, 24000)  # Ogg Opus decodes at 48 kHz whatever it was encoded at
        assert rate == expected and decoded > 0


def test_speed_speaker_and_sample_rate_are_honoured(server):
    async def frames_of(config: dict) -> int:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", **config}))
            utterance = await _utterance(ws, "Six words to speak right here.")
            assert not utterance.errors
            return sum(_wav(s.audio)[3] for s in utterance.sentences), _wav(utterance.sentences[0].audio)[0]

    async def run() -> tuple:
        return (await frames_of({"speaker": "Vivian"}), await frames_of({"speaker": "vivian", "speed": 2.0}),
                await frames_of({"voice": "ryan", "sample_rate": 16000}))  # fmt: skip

    (normal, rate), (fast, _), (_, low) = asyncio.run(run())
    assert rate == 24000 and low == 16000
    assert abs(fast - normal / 2) <= 2  # tone speaks each unit in unit_ms / speed: exactly half (rounding per unit)


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"response_format": "ulaw"}, "unsupported_format"),
        ({"ref_audio": "data:audio/wav;base64,UklGRg=="}, "not_supported"),
        ({"word_timestamps": True}, "not_supported"),
        ({"speed": 9}, "invalid_message"),
        ({"response_format": "opus", "sample_rate": 22050}, "unsupported_sample_rate"),
        ({"voice": "nobody-has-this-voice"}, "unknown_voice"),
    ],
)
def test_a_config_that_cannot_be_served_gets_an_error_with_a_message(server, config, code):
    async def run() -> dict:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", **config}))
            return json.loads(await asyncio.wait_for(ws.recv(), 30))

    reply = asyncio.run(run())
    assert reply["type"] == "error" and reply["code"] == code and reply["message"]


def test_a_new_config_between_utterances_applies_to_the_next_one_and_not_during_one(server):
    async def run() -> tuple[Utterance, dict, Utterance]:
        async with websockets.connect(_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
            first = await _utterance(ws, "First in pcm.")
            await ws.send(json.dumps({"type": "input.text", "text": "open "}))
            await ws.send(json.dumps({"type": "session.config", "response_format": "wav"}))
            refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
            await ws.send(json.dumps({"type": "input.done"}))
            while not _is_done(await asyncio.wait_for(ws.recv(), 30)):
                pass
            await ws.send(json.dumps({"type": "session.config", "response_format": "wav"}))
            second = await _utterance(ws, "Then in wav.")
            return first, refused, second

    first, refused, second = asyncio.run(run())
    assert first.sentences[0].start["format"] == "pcm" and refused["code"] == "utterance_open"
    assert second.sentences[0].start["format"] == "wav" and second.done["utterance_index"] == 2
    assert _wav(second.sentences[0].audio)[0] == 24000
