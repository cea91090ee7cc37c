"""Long text from the client's side: every transport hands the engine bounded pieces, spoken
as one stream; with piper, a 4,096-character text without punctuation costs bounded memory
and does not hold up another client's short request."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import websockets

from voxgate.audio import pcm16_bytes
from voxgate.bench.server import ServerProcess
from voxgate.engines.tone import ToneEngine, unit_samples
from voxgate.text import count_units
from voxgate.types import CancelToken, SynthesisRequest

TOKEN = "x" * 1000  # one unit; in pieces of at most 400 characters it is three (400, 400, 200)
WORDS = " ".join(random.Random(3).choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(700))
UNIT_BYTES = 2 * unit_samples(120, 1.0)  # the tone engine's default unit at 24 kHz, pcm16


@pytest.fixture(scope="module")
def tone() -> Iterator[ServerProcess]:
    with ServerProcess("tone") as server:
        yield server


def _http(server: ServerProcess, text: str) -> bytes:
    r = httpx.post(f"{server.url}/tts/stream", json={"text": text, "format": "pcm", "sample_rate": 24000}, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


def _openai(server: ServerProcess, text: str) -> bytes:
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    r = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


def _websocket(server: ServerProcess, text: str) -> bytes:
    async def run() -> bytes:
        audio = b""
        async with websockets.connect(server.url.replace("http://", "ws://") + "/v1/tts/ws") as ws:
            await ws.send(json.dumps({"type": "session.start"}))
            assert json.loads(await ws.recv())["type"] == "session.started"
            await ws.send(json.dumps({"type": "text.delta", "text": text, "first_unit_index": 0}))
            await ws.send(json.dumps({"type": "text.end"}))
            while True:
                message = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(message, bytes):
                    audio += message
                    continue
                event = json.loads(message)
                assert event["type"] != "error", event
                if event["type"] == "utterance.done":
                    assert event["status"] == "completed"
                    return audio

    return asyncio.run(run())


@pytest.mark.parametrize("speak", [_http, _openai, _websocket], ids=["tts_stream", "openai_speech", "websocket"])
def test_every_transport_speaks_long_text_in_bounded_pieces_as_one_stream(tone, speak):
    # The tone engine gives each unit of each call one tone, so the pieces show in the audio:
    # a 1,000-character token reaches it as three calls of at most 400 characters.
    assert len(speak(tone, TOKEN)) == 3 * UNIT_BYTES
    # Cut between words, a long text sounds exactly as the engine says it in one call.
    whole = np.concatenate([c.samples for c in ToneEngine().stream(SynthesisRequest(WORDS, "tone"), CancelToken())])
    assert len(WORDS) > 3000 and len(whole) * 2 == count_units(WORDS) * UNIT_BYTES
    assert speak(tone, WORDS) == pcm16_bytes(whole)


def test_the_piece_length_setting_is_honoured():
    with ServerProcess("tone", env={"MAX_PIECE_CHARS": "100"}) as server:
        assert len(_http(server, "y" * 250)) == 3 * UNIT_BYTES  # pieces of 100, 100 and 50


# ---------------------------------------------------------------------- piper


def _unpunctuated(chars: int) -> str:
    words = "the quick brown fox jumps over lazy dog and then runs away into forest near river while birds sing"
    pick = random.Random(1).choice
    text = ""
    while len(text) < chars:
        text += pick(words.split()) + " "
    return text[: chars - 1] + "s"


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))


@pytest.mark.slow
def test_piper_long_unpunctuated_text_has_bounded_memory_and_lets_a_short_request_through():
    """4,096 characters without a full stop peaked at 6.5 GB (5.0 GB here) in one ONNX run, and a
    concurrent "Hello there." waited for all of it. In pieces and capped runs, the peak grows
    by ~200 MB, and the short request finishes while most of the long one is still to come."""
    with ServerProcess("piper") as server:
        pid = server._proc.pid  # type: ignore[union-attr]
        before = _peak_rss_mb(pid)
        long_bytes, first_audio, long_done = [0], threading.Event(), threading.Event()

        def read_long() -> None:
            body = {"text": _unpunctuated(4096), "format": "pcm"}
            with httpx.stream("POST", f"{server.url}/tts/stream", json=body, timeout=600) as r:
                assert r.status_code == 200
                for piece in r.iter_raw():
                    long_bytes[0] += len(piece)
                    first_audio.set()
            long_done.set()

        reader = threading.Thread(target=read_long, daemon=True)
        reader.start()
        assert first_audio.wait(600)
        short = httpx.post(f"{server.url}/tts/stream", json={"text": "Hello there.", "format": "pcm"}, timeout=600)
        at_short_done, long_finished_first = long_bytes[0], long_done.is_set()
        reader.join(600)
        assert short.status_code == 200 and len(short.content) > 0
        assert not long_finished_first and at_short_done < long_bytes[0] / 2, (at_short_done, long_bytes[0])
        assert long_bytes[0] > 2 * 22050 * 150  # the whole text was spoken: > 150 s of audio
        growth = _peak_rss_mb(pid) - before
        assert growth < 500, f"peak RSS grew by {growth:.0f} MB"
