"""The voice agent's page in a real browser: headless Debian chromium, its fake microphone
playing a Piper-made question, calls `voxgate serve`'s agent (Silero VAD -> whisper tiny.en
-> embedded SmolLM2 -> Piper) through voxgate/web/agent.js, as a person would from the page.

Chromium comes from Debian (`make test` installs it); the test skips without it only outside
CI. Playwright drives it by path: it never downloads a browser of its own."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from voxgate.audio import resample, wav_bytes
from voxgate.engines.piper import PiperEngine
from voxgate.types import CancelToken, SynthesisRequest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
         "--autoplay-policy=no-user-gesture-required"]  # fmt: skip
QUESTION = "What is the capital of France?"
MIC_RATE = 48000
SCREENSHOT = Path("/tmp/voxgate-agent-page.png")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The question as the fake microphone plays it once: 3 s of silence while the call
    connects (the file starts with the capture, before the offer), the speech, then silence
    long enough for the whole reply."""
    engine = PiperEngine()
    request = SynthesisRequest(text=QUESTION, voice=engine.voices()[0].id, seed=0)  # no sampling noise: same every run
    chunks = list(engine.stream(request, CancelToken()))
    speech = resample(np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate, MIC_RATE)
    quiet = np.zeros(3 * MIC_RATE, dtype=np.float32)
    path = tmp_path_factory.mktemp("mic") / "question.wav"
    path.write_bytes(wav_bytes(np.concatenate([quiet, speech, np.zeros(60 * MIC_RATE, np.float32)]), MIC_RATE))
    return path


@pytest.fixture
def browser(mic_wav: Path) -> Iterator[object]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (make test installs Debian's chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        args = [*FLAGS, f"--use-file-for-fake-audio-capture={mic_wav}%noloop"]
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()


def _events(page, kind: str) -> list[dict]:
    return page.evaluate("(kind) => window.voxgate.events.filter((e) => e.type === kind)", kind)


def test_the_page_holds_a_spoken_call_with_transcript_reply_audio_and_latency(bridge, browser):
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{bridge.url}/agent")
    assert page.inner_text("#call") == "Start call"
    page.click("#call")

    page.wait_for_function("() => window.voxgate.state === 'listening'", timeout=30_000)
    assert page.inner_text("#call") == "Hang up"
    page.wait_for_function("() => window.voxgate.events.some((e) => e.type === 'reply.end')", timeout=120_000)
    said = page.locator("#log li.user").first.inner_text().lower()
    assert "what is the capital" in said, said  # tiny.en sometimes hears "France" as "friends"
    end = _events(page, "reply.end")[0]
    assert end["status"] == "completed" and end["heard"], end
    agent = page.locator("#log li.agent span").first.inner_text()
    assert agent == end["heard"]  # the page showed each segment as it was spoken, all of it

    # The reply's audio reached the browser: WebRTC's received energy (silence has none), and
    # the page's own level meter (Web Audio on the remote stream) saw it.
    page.wait_for_function("() => window.voxgate.audio.energy > 0.001", timeout=10_000)
    assert page.evaluate("() => window.voxgate.audio.peak") > 0.01
    # The latency figures: this call's EoT -> first audio and the turn's breakdown, in ms.
    page.wait_for_function("() => window.voxgate.eot.length === 1", timeout=10_000)
    for figure in ("#eot-p50", "#eot-p95"):
        assert re.fullmatch(r"\d+ ms", page.inner_text(figure)), page.inner_text(figure)
    for stage in ("hangover", "stt", "llm", "tts", "eot"):
        cell = page.inner_text(f'#breakdown [data-stage="{stage}"] td')
        assert re.fullmatch(r"\d+ ms", cell), (stage, cell)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    call_id = page.evaluate("() => window.voxgate.callId")
    page.click("#call")
    page.wait_for_function("() => window.voxgate.state === 'ended'", timeout=10_000)
    assert page.inner_text("#call") == "Start call"
    gone = httpx.delete(f"{bridge.url}/v1/agent/{call_id}")  # the page hung up: the server has no such call
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert errors == []


def test_the_page_and_its_files_are_served_and_nothing_else_under_static(bridge):
    for path, kind in (("/", "text/html"), ("/agent", "text/html"), ("/agent/static/agent.js", "text/javascript"),
                       ("/agent/static/agent.css", "text/css")):  # fmt: skip
        reply = httpx.get(bridge.url + path)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(kind), path
    assert 'src="/agent/static/agent.js"' in httpx.get(bridge.url + "/agent").text
    for path in ("/agent/static/agent.html", "/agent/static/..%2Fserving%2Fpage.py", "/agent/static/nope.js"):
        assert httpx.get(bridge.url + path).status_code == 404, path


def test_the_page_ends_the_call_when_the_server_hangs_up(bridge, browser):
    page = browser.new_page()
    page.goto(f"{bridge.url}/")
    page.click("#call")
    page.wait_for_function("() => window.voxgate.state === 'listening'", timeout=30_000)
    call_id = page.evaluate("() => window.voxgate.callId")
    assert httpx.delete(f"{bridge.url}/v1/agent/{call_id}").status_code == 200
    page.wait_for_function("() => window.voxgate.state === 'ended'", timeout=15_000)
    assert page.inner_text("#status") == "ended (the server hung up)" and page.inner_text("#call") == "Start call"


def test_behind_api_keys_the_page_is_open_and_its_api_calls_are_not(slow_server):
    for path in ("/", "/agent", "/agent/static/agent.js", "/agent/static/agent.css"):
        assert httpx.get(slow_server.url + path).status_code == 200, path
    offer = httpx.post(slow_server.url + "/v1/agent/offer", json={"sdp": "v=0", "type": "offer"})
    assert offer.status_code == 401 and offer.json()["error"]["code"] == "unauthorized"
