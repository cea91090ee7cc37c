"""The voice agent's page in a real browser: headless Debian chromium, its fake microphone
playing a Piper-made question, calls `voxgate serve`'s agent (Silero VAD -> whisper tiny.en
-> embedded SmolLM2 -> Piper) through voxgate/web/agent.js, as a person would from the page.

Chromium comes from Debian (`make test` installs it); the test skips without it only outside
CI. Playwright drives it by path: it never downloads a browser of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from voxgate.bench.page import CHROMIUM, checks, drive, open_browser, question_wav

SCREENSHOT = Path("/tmp/voxgate-agent-page.png")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return question_wav(tmp_path_factory.mktemp("mic") / "question.wav")


@pytest.fixture
def browser(mic_wav: Path) -> Iterator[object]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing (make test installs Debian's chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with open_browser(CHROMIUM, mic_wav) as browser:
        yield browser


def test_the_page_holds_a_spoken_call_with_transcript_reply_audio_and_latency(bridge, browser):
    """The same driver and checks as `voxgate bench page` (the GPU machine's run): the call
    connects, the transcript shows the question, the reply completes and its text is shown as
    heard, its audio reaches the browser (WebRTC energy, the page's level meter), the latency
    figures and breakdown show, hanging up ends the call on the server too, no page error."""
    SCREENSHOT.unlink(missing_ok=True)
    run = drive(browser, bridge.url, SCREENSHOT)
    assert run["failed"] is None, run
    verdict = checks(run)
    assert all(verdict.values()), (verdict, run)
    assert SCREENSHOT.stat().st_size > 10_000  # this call's


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
