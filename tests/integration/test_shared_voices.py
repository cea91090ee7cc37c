"""Cloned voices shared by replicas while they run (issue 21): two real `voxgate serve`
processes on one VOXGATE_DATA_DIR (what replicas are), each with a tiny random Qwen3-TTS
Base checkpoint (the engine that clones); and processes writing one data dir at once."""

from __future__ import annotations

import asyncio
import base64
import io
import multiprocessing
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from tests.integration.wsclient import Client
from voxgate.bench.server import ServerProcess
from voxgate.serving.voice_store import StoredVoice, VoiceStore
from voxgate.types import VoiceExists

KEY_A, KEY_B = "key-a-5d1c0e", "key-b-93aa4f"
WAIT_S = 30.0  # for a state the poller brings (it looks every 2 s): a deadline, not a measure


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def wav(seconds: float = 1.5, rate: int = 24000) -> bytes:
    """A tone as a 16-bit WAV (what the server decodes and resamples for the engine)."""
    import wave

    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((0.3 * np.sin(2 * np.pi * 180 * t) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def upload(url: str, key: str, voice_id: str) -> httpx.Response:
    body = {"id": voice_id, "audio": base64.b64encode(wav()).decode(), "text": "Hello there."}
    return httpx.post(f"{url}/v1/voices", json=body, headers=auth(key), timeout=120)


def speak(url: str, key: str, voice: str) -> httpx.Response:
    body = {"text": "Still here.", "voice": voice, "seed": 5}
    return httpx.post(f"{url}/tts/stream", json=body, headers=auth(key), timeout=120)


def listed(url: str, key: str) -> list[str]:
    return [v["id"] for v in httpx.get(f"{url}/v1/voices", headers=auth(key), timeout=60).json()["voices"]]


def code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


def wait_for_log(server: ServerProcess, text: str) -> None:
    """Until a line of the server's log holds `text` (polled, with a deadline)."""
    deadline = time.monotonic() + WAIT_S
    while not any(text in line for line in server.log):
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n" + "\n".join(server.log)
        time.sleep(0.05)


async def ws_start(server: ServerProcess, key: str, voice: str) -> dict:
    """The gateway's answer to a session.start naming `voice` (it plans without asking the store)."""
    url = server.url.replace("http://", "ws://") + "/v1/tts/ws"
    async with websockets.connect(url, additional_headers=auth(key)) as ws:
        return await Client(ws).start(voice=voice)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two replicas on one data dir, started together (both create the secret at once)."""
    pytest.importorskip("torch")
    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint

    root = tmp_path_factory.mktemp("shared")
    model = make_random_checkpoint("Qwen3-TTS-12Hz-0.6B-Base", root / "b06", tiny=True, seed=7)
    env = {"QWEN3_MODEL_DIR": str(model), "STARTER_CACHE": "false", "DATA_DIR": str(root / "data"),
           "API_KEYS": f"{KEY_A},{KEY_B}", "MAX_VOICES_PER_CLIENT": "2"}  # fmt: skip
    a, b = ServerProcess("qwen3", env=env), ServerProcess("qwen3", env=env)
    with ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        stack.push(a)
        stack.push(b)
        list(pool.map(ServerProcess.__enter__, (a, b)))
        yield a, b


@pytest.mark.slow
def test_a_voice_cloned_on_one_replica_speaks_on_the_other_and_a_delete_reaches_both(replicas):
    a, b = replicas
    assert upload(a.url, KEY_A, "alice").status_code == 201
    assert listed(b.url, KEY_A) == ["alice"] and listed(b.url, KEY_B) == []
    on_a, on_b = speak(a.url, KEY_A, "alice"), speak(b.url, KEY_A, "alice")
    assert on_b.status_code == 200 and on_b.content == on_a.content  # the same voice, bit for bit

    # the owner holds on B: the same key, the same digest
    assert code(speak(b.url, KEY_B, "alice")) == "unknown_voice"
    assert code(upload(b.url, KEY_B, "alice")) == "voice_exists"
    assert httpx.delete(f"{b.url}/v1/voices/alice", headers=auth(KEY_B)).status_code == 404

    assert httpx.delete(f"{b.url}/v1/voices/alice", headers=auth(KEY_A)).status_code == 204
    refused = speak(a.url, KEY_A, "alice")
    assert refused.status_code == 400 and code(refused) == "unknown_voice"
    assert listed(a.url, KEY_A) == []
    assert upload(a.url, KEY_B, "alice").status_code == 201  # the id is free again, everywhere
    assert code(speak(b.url, KEY_A, "alice")) == "unknown_voice" and listed(b.url, KEY_B) == ["alice"]
    assert httpx.delete(f"{b.url}/v1/voices/alice", headers=auth(KEY_B)).status_code == 204


@pytest.mark.slow
def test_the_cap_counts_voices_cloned_through_every_replica(replicas):
    a, b = replicas
    assert upload(a.url, KEY_A, "one").status_code == 201
    assert upload(b.url, KEY_A, "two").status_code == 201
    assert code(upload(a.url, KEY_A, "three")) == "too_many_voices"
    for voice, server in (("one", b), ("two", a)):
        assert httpx.delete(f"{server.url}/v1/voices/{voice}", headers=auth(KEY_A)).status_code == 204


@pytest.mark.slow
def test_a_replica_that_is_not_asked_picks_up_clones_and_deletes_by_polling(replicas):
    """The WebSocket gateway plans from what the replica holds: the poller keeps that current."""
    a, b = replicas
    assert upload(a.url, KEY_A, "bob").status_code == 201
    wait_for_log(b, "voice bob (icl) registered")
    assert asyncio.run(ws_start(b, KEY_A, "bob"))["type"] == "session.started"

    assert httpx.delete(f"{a.url}/v1/voices/bob", headers=auth(KEY_A)).status_code == 204
    wait_for_log(b, "stored voice 'bob' is no longer served here")
    refused = asyncio.run(ws_start(b, KEY_A, "bob"))
    assert refused["type"] == "error" and refused["code"] == "unknown_voice"


# ---------------------------------------------------------------- processes writing one data dir


def _writer(data_dir: str, owner: str, ready, results) -> None:
    """One process: the secret, a contested id, then its own voice rewritten and deleted."""
    store = VoiceStore(Path(data_dir))
    ready.wait()
    secret = store.secret()
    rng = np.random.default_rng(int(owner[0], 16))
    try:
        store.save(StoredVoice("contested", "qwen3", None, owner, rng.standard_normal(4800).astype(np.float32), 24000))
        won = True
    except VoiceExists:
        won = False
    own = f"own-{owner[0]}"
    for i in range(40):
        samples = rng.standard_normal(2400 + 240 * i).astype(np.float32)
        store.save(StoredVoice(own, "qwen3", f"take {i}", owner, samples, 24000))
        if i % 3 == 2:
            store.delete(own, owner)
    results.put((owner, secret, won))


def test_two_processes_writing_one_data_dir_leave_no_torn_voice_and_one_owner_an_id(tmp_path):
    """Readers never see half a voice (a file either whole or absent), a contested id gets
    exactly one owner, and both processes make and read the same secret."""
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Event(), ctx.Queue()
    owners = ("a" * 64, "b" * 64)
    writers = [ctx.Process(target=_writer, args=(str(tmp_path), o, ready, results)) for o in owners]
    for p in writers:
        p.start()
    ready.set()
    store = VoiceStore(tmp_path)
    while any(p.is_alive() for p in writers):
        for voice_id in store.listing():
            with suppress(FileNotFoundError):  # deleted or replaced meanwhile: the next look sees it whole
                store.read(voice_id)  # raises ValueError on a torn manifest or audio
    for p in writers:
        p.join(timeout=60)
        assert p.exitcode == 0
    done = [results.get(timeout=5) for _ in owners]
    assert len({secret for _, secret, _ in done}) == 1
    assert sorted(won for _, _, won in done) == [False, True]
    winner = next(owner for owner, _, won in done if won)
    assert store.read("contested").owner == winner
    kept = {v.id: v for v in store.load()}
    assert set(kept) == {"contested", "own-a", "own-b"}
    assert kept["own-a"].ref_text == "take 39" and kept["own-b"].ref_text == "take 39"
    assert not [p for p in tmp_path.rglob(".tmp-*")]  # no temporary file left behind


def test_names_a_request_may_send_never_reach_outside_the_store(tmp_path):
    """Every request naming a voice stats the store: an id that is not one is no path at all."""
    store = VoiceStore(tmp_path / "data")
    store.save(StoredVoice("ok", "qwen3", None, "a" * 64, np.zeros(2400, np.float32), 24000))
    (tmp_path / "data" / "voices" / "not-hex").mkdir()
    (tmp_path / "data" / "voices" / "6869").write_text("a file, not a folder")  # "hi"
    for name in ("..", "../secret", "a/b", "", "x" * 65, "ok\0", "é", "\u202eok"):
        assert store.signature(name) is None, name
    assert set(store.listing()) == {"ok"}
    assert store.signature("ok") == store.listing()["ok"]
