"""Cloned voices outlive the server (`VOXGATE_DATA_DIR`): a real server with a tiny random
Qwen3-TTS Base checkpoint is stopped and a new one started on the same data directory."""

from __future__ import annotations

import base64
import io
import json

import av
import httpx
import numpy as np
import pytest

from voxgate.bench.server import ServerProcess

pytestmark = pytest.mark.slow

KEY_A, KEY_B = "key-a-0f3c9d", "key-b-77e1a2"


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def mp3(seconds: float = 1.5, rate: int = 44100) -> bytes:
    """A tone as a real MP3 (at 44.1 kHz: the server resamples it to the engine's 24 kHz)."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp3") as media:
        stream = media.add_stream("libmp3lame", rate=rate, layout="mono")
        t = np.arange(int(seconds * rate)) / rate
        frame = av.AudioFrame.from_ndarray((0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)[None],
                                           format="fltp", layout="mono")  # fmt: skip
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            media.mux(packet)
    return out.getvalue()


def upload(url: str, key: str, voice_id: str) -> httpx.Response:
    body = {"id": voice_id, "audio": base64.b64encode(mp3()).decode(), "text": "Hello there."}
    return httpx.post(f"{url}/v1/voices", json=body, headers=auth(key), timeout=120)


def speak(url: str, key: str, voice: str) -> httpx.Response:
    body = {"text": "Still here.", "voice": voice, "seed": 5}
    return httpx.post(f"{url}/tts/stream", json=body, headers=auth(key), timeout=120)


def listed(url: str, key: str) -> list[str]:
    return [v["id"] for v in httpx.get(f"{url}/v1/voices", headers=auth(key)).json()["voices"]]


def code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


def folder(voice_id: str) -> str:
    """The store's folder name for a voice id (its hex)."""
    return voice_id.encode().hex()


def plant_broken_entries(data_dir) -> None:
    """What a restart must live through: a torn entry and a voice of another engine."""
    voices = data_dir / "voices"
    (voices / folder("broken")).mkdir()
    (voices / folder("broken") / "voice.json").write_text("{torn")
    alice, other = voices / folder("alice"), voices / folder("piper-voice")
    other.mkdir()
    for part in alice.iterdir():
        (other / part.name).write_bytes(part.read_bytes())
    manifest = json.loads((other / "voice.json").read_text())
    (other / "voice.json").write_text(json.dumps({**manifest, "id": "piper-voice", "engine": "piper"}))


def test_a_cloned_voice_survives_a_restart_and_stays_its_owners(tiny_dirs, tmp_path):
    data_dir = tmp_path / "data"
    env = {"QWEN3_MODEL_DIR": str(tiny_dirs["b06"]), "STARTER_CACHE": "false", "DATA_DIR": str(data_dir),
           "API_KEYS": f"{KEY_A},{KEY_B}", "MAX_VOICES_PER_CLIENT": "1"}  # fmt: skip
    with ServerProcess("qwen3", env=env) as server:
        created = upload(server.url, KEY_A, "alice")
        assert created.status_code == 201, created.text
        before = speak(server.url, KEY_A, "alice")
        assert before.status_code == 200 and len(before.content) > 0
    plant_broken_entries(data_dir)

    # the keys in another order: `key0` is now B, and alice must still be A's
    with ServerProcess("qwen3", env={**env, "API_KEYS": f"{KEY_B},{KEY_A}"}) as server:
        url = server.url
        assert listed(url, KEY_A) == ["alice"] and listed(url, KEY_B) == []
        assert sum("skipped" in line for line in server.log) == 2  # the torn entry, the piper voice
        after = speak(url, KEY_A, "alice")
        assert after.status_code == 200 and after.content == before.content  # the same voice, bit for bit
        refused = speak(url, KEY_B, "alice")
        assert refused.status_code == 400 and code(refused) == "unknown_voice"
        assert code(upload(url, KEY_B, "alice")) == "voice_exists"
        stolen = httpx.delete(f"{url}/v1/voices/alice", headers=auth(KEY_B))
        assert stolen.status_code == 404 and code(stolen) == "not_found"
        assert code(upload(url, KEY_A, "carol")) == "too_many_voices"  # the cap counts the restored voice
        assert httpx.delete(f"{url}/v1/voices/alice", headers=auth(KEY_A)).status_code == 204
        assert listed(url, KEY_A) == []

    stored = sorted(p.name for p in (data_dir / "voices").iterdir())
    assert stored == sorted(folder(v) for v in ("broken", "piper-voice"))  # skipped, never deleted
    for path in data_dir.rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert KEY_A.encode() not in content and KEY_B.encode() not in content, path
