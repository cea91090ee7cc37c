"""Voice cloning on a Base model: the voice cache, the engine, and POST/GET/DELETE /v1/voices."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from voxgate.audio import wav_bytes
from voxgate.bench.server import ServerProcess
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.engine import Qwen3Engine
from voxgate.engines.qwen3.voices import VoiceStore
from voxgate.types import CancelToken, InvalidRequest, NotFound, NotSupported, SynthesisRequest, UnknownVoice


def _voice_audio(seconds: float = 1.5, rate: int = 24000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def test_voice_store_computes_each_voice_once():
    calls = []

    def embed(wav: torch.Tensor) -> torch.Tensor:
        calls.append(len(wav))
        return torch.ones(4)

    store = VoiceStore(embed, encode=None)
    audio = _voice_audio()
    first, computed = store.add("alice", audio, None, icl=False)
    again, computed_again = store.add("alice", audio, None, icl=False)
    assert computed and not computed_again and again is first and len(calls) == 1
    _, changed = store.add("alice", _voice_audio(seed=1), None, icl=False)
    assert changed and len(calls) == 2
    with pytest.raises(InvalidRequest, match="codec encoder"):
        store.add("bob", audio, "transcript", icl=True)
    with pytest.raises(InvalidRequest, match="must last"):
        store.add("carol", audio[:1000], None, icl=False)
    store.remove("alice")
    with pytest.raises(UnknownVoice):
        store.get("alice")
    with pytest.raises(NotFound):
        store.remove("alice")


def test_base_engine_speaks_a_registered_voice(ours):
    engine = Qwen3Engine(ours["b06"], sampling=SamplingParams.greedy(max_new_tokens=6))
    assert engine.voices() == []
    engine.warmup()
    info = engine.add_voice("alice", _voice_audio(rate=16000), 16000, None)  # resampled to 24 kHz
    assert info.id == "alice" and "xvector" in info.description
    audio = b"".join(
        c.samples.tobytes() for c in engine.stream(SynthesisRequest(text="Hi.", voice="alice"), CancelToken())
    )
    assert len(audio) == 5 * 1920 * 4
    with pytest.raises(UnknownVoice):
        list(engine.stream(SynthesisRequest(text="Hi.", voice="nobody"), CancelToken()))


def test_custom_voice_engine_cannot_clone(ours):
    engine = Qwen3Engine(ours["cv06"], sampling=SamplingParams.greedy(max_new_tokens=3))
    with pytest.raises(NotSupported):
        engine.add_voice("x", _voice_audio(), 24000, None)


@pytest.fixture(scope="module")
def base_server(tiny_dirs):
    env = {"QWEN3_MODEL_DIR": str(tiny_dirs["b06"]), "STARTER_CACHE": "false"}
    with ServerProcess("qwen3", env=env) as server:
        yield server


def _upload(server, voice_id: str, audio: np.ndarray, rate: int = 24000, text: str | None = None) -> httpx.Response:
    body = {"id": voice_id, "audio": base64.b64encode(wav_bytes(audio, rate)).decode()}
    if text is not None:
        body["text"] = text
    return httpx.post(f"{server.url}/v1/voices", json=body, timeout=120)


def test_clone_voice_over_http_then_speak_and_delete_it(base_server):
    url = base_server.url
    before = httpx.post(f"{url}/tts/stream", json={"text": "No voices yet."})
    assert before.status_code == 400 and before.json()["error"]["code"] == "unknown_voice"
    created = _upload(base_server, "alice", _voice_audio())
    assert created.status_code == 201 and created.json()["id"] == "alice"
    assert [v["id"] for v in httpx.get(f"{url}/v1/voices").json()["voices"]] == ["alice"]
    # unchanged: served from the cache (test_voice_store_computes_each_voice_once checks the store)
    assert _upload(base_server, "alice", _voice_audio()).status_code == 201
    spoken = httpx.post(f"{url}/tts/stream", json={"text": "Cloned.", "voice": "alice", "seed": 1}, timeout=120)
    assert spoken.status_code == 200 and len(spoken.content) > 0 and len(spoken.content) % (1920 * 2) == 0
    assert httpx.delete(f"{url}/v1/voices/alice").status_code == 204
    gone = httpx.delete(f"{url}/v1/voices/alice")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    after = httpx.post(f"{url}/tts/stream", json={"text": "Gone.", "voice": "alice"})
    assert after.status_code == 400 and after.json()["error"]["code"] == "unknown_voice"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"id": "bad id!", "audio": "AAAA"}, "invalid_request"),
        ({"id": "x", "audio": "***not base64***"}, "invalid_request"),
        ({"id": "x", "audio": base64.b64encode(b"RIFF....garbage").decode()}, "invalid_audio"),
        (
            {"id": "x", "audio": base64.b64encode(wav_bytes(np.zeros(1000, np.float32), 24000)).decode()},
            "invalid_audio",
        ),
        ({"id": "x"}, "invalid_request"),
    ],
)
def test_bad_voice_uploads_get_typed_errors(base_server, body, code):
    r = httpx.post(f"{base_server.url}/v1/voices", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == code


def test_engines_that_cannot_clone_say_so(tone_server):
    r = httpx.post(f"{tone_server.url}/v1/voices", json={"id": "x", "audio": "AAAA"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "not_supported"


def test_in_context_voice_uses_reference_codes_from_our_encoder(ours):
    ck = ours["b06"]
    assert ck.encoder is not None
    engine = Qwen3Engine(ck, sampling=SamplingParams.greedy(max_new_tokens=6))
    info = engine.add_voice("bob", _voice_audio(seconds=2.0, seed=4), 24000, "This is how I sound.")
    assert "icl" in info.description
    voice = engine.clones.get("bob")
    assert voice.ref_codes is not None and voice.ref_codes.shape == (25, 16)  # ceil(48000 / 1920)
    chunks = list(engine.stream(SynthesisRequest(text="Hello.", voice="bob"), CancelToken()))
    assert sum(len(c.samples) for c in chunks) == 5 * 1920


def test_clone_in_context_over_http(base_server):
    created = _upload(base_server, "carol", _voice_audio(seconds=1.2, seed=5), text="A short reference.")
    assert created.status_code == 201 and "icl" in created.json()["description"]
    spoken = httpx.post(f"{base_server.url}/tts/stream", json={"text": "Hi.", "voice": "carol", "seed": 3}, timeout=120)
    assert spoken.status_code == 200 and len(spoken.content) % (1920 * 2) == 0


def test_in_context_speech_continues_the_reference_like_the_reference_decode(ours):
    """The reference implementation decodes reference + new codes and cuts the reference's
    samples; streaming from the cached pre-roll state must give those samples."""
    from voxgate.engines.qwen3.generate import generate_codes

    ck = ours["b06"]
    engine = Qwen3Engine(ck, sampling=SamplingParams.greedy(max_new_tokens=8))
    engine.add_voice("dora", _voice_audio(seconds=1.0, seed=6), 24000, "Reference words.")
    voice = engine.clones.get("dora")
    streamed = np.concatenate(
        [c.samples for c in engine.stream(SynthesisRequest(text="Go on.", voice="dora"), CancelToken())]
    )
    prompt = engine.prompts.build(
        "Go on.", speaker_embedding=voice.speaker_embedding, ref_codes=voice.ref_codes, ref_text=voice.ref_text,
        stream_text=True,
    )  # fmt: skip
    codes = torch.stack(list(generate_codes(ck.talker, prompt, SamplingParams.greedy(max_new_tokens=8))))
    whole = ck.codec.decode(torch.cat([voice.ref_codes, codes]).T[None])[0].numpy()
    # to float rounding: GEMMs of other widths round differently (see PCM_ATOL in test_qwen3.py);
    # without the cached pre-roll the continuation would be off by far more
    np.testing.assert_allclose(streamed, whole[len(voice.ref_codes) * 1920 :], rtol=0, atol=1e-5)


def test_batched_engine_speaks_cloned_voices_like_the_eager_one(ours):
    """The batched runner continues each in-context voice from its reference pre-roll, per row."""
    params = SamplingParams.greedy(max_new_tokens=8, min_new_tokens=8)
    eager = Qwen3Engine(ours["b06"], sampling=params)
    batched = Qwen3Engine(ours["b06"], sampling=params, batched=True, max_streams=4, kv_capacity=256)
    try:
        for engine in (eager, batched):
            engine.add_voice("bob", _voice_audio(seconds=2.0, seed=4), 24000, "This is how I sound.")
            engine.add_voice("amy", _voice_audio(seconds=1.0, seed=5), 24000, None)  # x-vector only
        for voice in ("bob", "amy"):
            request = SynthesisRequest(text="Same words, two runners.", voice=voice)
            expected = np.concatenate([c.samples for c in eager.stream(request, CancelToken())])
            got = np.concatenate([c.samples for c in batched.stream(request, CancelToken())])
            np.testing.assert_allclose(got, expected, atol=1e-5)
    finally:
        batched.close()
