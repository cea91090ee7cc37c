"""`voxgate bench page`: the voice agent's page (voxgate/web/agent.js) in a headless Chromium,
driven as a person would: a fake microphone plays a Piper-made question, the page calls the
agent over WebRTC, and what the page then shows is recorded as JSON (the call connected, the
transcript, the reply's text and audio, the latency figures) with a screenshot.

The same driver runs the browser test (tests/integration/test_browser.py, Debian's chromium,
the Piper agent) and the GPU machine's run (bench/gpu_agent.sh page: the bundle's chromium
against qwen3 on CUDA), so both hold the page to the same checks (`checks`). Playwright drives
the given executable; it never downloads a browser of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from voxgate.bench.server import ServerProcess, add_set_argument, settings_env
from voxgate.bench.stats import machine, write_report

CHROMIUM = Path("/usr/bin/chromium")
# Loopback joins the browser's ICE candidates: the GPU machine has no other interface (its server
# offers an address put on lo, which Chromium ignores without this flag).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--allow-loopback-in-peer-connection",
         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
         "--autoplay-policy=no-user-gesture-required"]  # fmt: skip
QUESTION = "What is the capital of France?"
HEARD = "what is the capital"  # tiny.en sometimes hears "France" as "friends"
MIC_RATE = 48000
STAGES = ("hangover", "stt", "llm", "tts", "eot")
# Seconds each step may take: the reply's may include a slow first turn (model loads) and its whole audio.
WAITS = {"connect": 30, "reply": 120, "audio": 10, "latency": 10, "hang_up": 10}
_MS = re.compile(r"\d+ ms")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server with the agent (default: start the Piper one)")
    parser.add_argument("--chromium", default=str(CHROMIUM), help=f"the browser to drive (default {CHROMIUM})")
    parser.add_argument("--mic-wav", default=None, help="the fake microphone's WAV (default: the question, made now)")
    parser.add_argument("--record-question", default=None, metavar="WAV",
                        help="write the question as the microphone plays it (Piper) and exit: for a machine "
                             "without Piper (bench/gpu_bundle_page.sh)")  # fmt: skip
    parser.add_argument("--screenshot", default=None, help="PNG of the page once the reply's figures show")
    parser.add_argument("--output-json", default=None, help="default bench/results/page-<time>.json")
    add_set_argument(parser)


def question_wav(path: Path, question: str = QUESTION) -> Path:
    """The question as the fake microphone plays it once: 3 s of silence while the call connects
    (the file starts with the capture, before the offer), the speech, then silence long enough
    for the whole reply."""
    import numpy as np

    from voxgate.audio import resample, wav_bytes
    from voxgate.engines.piper import PiperEngine
    from voxgate.types import CancelToken, SynthesisRequest

    engine = PiperEngine()
    request = SynthesisRequest(text=question, voice=engine.voices()[0].id, seed=0)  # no sampling noise
    chunks = list(engine.stream(request, CancelToken()))
    speech = resample(np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate, MIC_RATE)
    quiet = np.zeros(3 * MIC_RATE, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(wav_bytes(np.concatenate([quiet, speech, np.zeros(60 * MIC_RATE, np.float32)]), MIC_RATE))
    return path


@contextlib.contextmanager
def open_browser(chromium: Path, mic_wav: Path) -> Iterator[Any]:
    """A Playwright browser on `chromium` (headless), its microphone playing `mic_wav` once."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        args = [*FLAGS, f"--use-file-for-fake-audio-capture={mic_wav}%noloop"]
        browser = playwright.chromium.launch(executable_path=str(chromium), headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()


def _events(page: Any, kind: str) -> list[dict[str, Any]]:
    return page.evaluate("(kind) => window.voxgate.events.filter((e) => e.type === kind)", kind)


def _wait(page: Any, step: str, condition: str) -> None:
    page.wait_for_function(condition, timeout=WAITS[step] * 1000)


def drive(browser: Any, url: str, screenshot: Path | None = None) -> dict[str, Any]:
    """One call from the page at `url`: start it, let the microphone ask, wait for the reply and
    its figures, hang up. Returns what was seen, step by step; `failed` names the step that did
    not happen in time (the later ones are then absent)."""
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    run: dict[str, Any] = {"url": url, "page_errors": [], "ms": {}, "failed": None}
    page.on("pageerror", lambda error: run["page_errors"].append(str(error)))
    t0 = time.perf_counter()

    def seen(step: str) -> None:
        run["ms"][step] = round((time.perf_counter() - t0) * 1000)

    step = "load"
    try:
        page.goto(f"{url}/agent")
        run["button_before"] = page.inner_text("#call")
        t0 = time.perf_counter()
        page.click("#call")
        step = "connect"
        _wait(page, step, "() => window.voxgate.state === 'listening'")
        seen(step)
        run["call_id"] = page.evaluate("() => window.voxgate.callId")
        run["button_in_call"] = page.inner_text("#call")
        step = "reply"
        _wait(page, step, "() => window.voxgate.events.some((e) => e.type === 'reply.end')")
        seen(step)
        run["user_text"] = page.locator("#log li.user").first.inner_text()
        run["reply_end"] = _events(page, "reply.end")[0]
        run["agent_text"] = page.locator("#log li.agent span").first.inner_text()
        step = "audio"  # WebRTC's received energy (silence has none), the page's level meter its peak
        _wait(page, step, "() => window.voxgate.audio.energy > 0.001")
        run["audio"] = page.evaluate("() => window.voxgate.audio")
        step = "latency"
        _wait(page, step, "() => window.voxgate.eot.length === 1")
        run["eot_ms"] = page.evaluate("() => window.voxgate.eot")
        run["figures"] = {name: page.inner_text(f"#eot-{name}") for name in ("p50", "p95")}
        run["breakdown"] = {s: page.inner_text(f'#breakdown [data-stage="{s}"] td') for s in STAGES}
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
            run["screenshot"] = str(screenshot)
        step = "hang_up"
        page.click("#call")
        _wait(page, step, "() => window.voxgate.state === 'ended'")
        seen(step)
        run["button_after"] = page.inner_text("#call")
        gone = httpx.delete(f"{url}/v1/agent/{run['call_id']}")  # the page hung up: the server has no such call
        run["server_after_hang_up"] = {"status": gone.status_code, "body": gone.json()}
    except Exception as exc:  # Playwright's timeout or error: the step that failed, kept in the result
        run["failed"] = f"{step}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if screenshot is not None and step != "load":  # the page as it stood when the step failed
            with contextlib.suppress(Exception):
                page.screenshot(path=str(screenshot), full_page=True)
                run["screenshot"] = str(screenshot)
    finally:
        page.close()
    return run


CHECKS = ("connected", "transcript_shown", "reply_completed", "reply_text_shown", "reply_audio_played",
          "latency_shown", "hung_up", "no_page_errors")  # fmt: skip


def checks(run: dict[str, Any]) -> dict[str, bool]:
    """The browser test's criteria, each true or false for a `drive` result."""
    end, audio, gone = run.get("reply_end", {}), run.get("audio", {}), run.get("server_after_hang_up", {})
    figures, breakdown = run.get("figures", {}), run.get("breakdown", {})
    shown = [*figures.values(), *breakdown.values()]
    verdict = {
        "connected": run.get("button_before") == "Start call" and run.get("button_in_call") == "Hang up",
        "transcript_shown": HEARD in run.get("user_text", "").lower(),
        "reply_completed": end.get("status") == "completed" and bool(end.get("heard")),
        "reply_text_shown": bool(run.get("agent_text")) and run.get("agent_text") == end.get("heard"),
        "reply_audio_played": audio.get("energy", 0) > 0.001 and audio.get("peak", 0) > 0.01,
        "latency_shown": len(run.get("eot_ms", [])) == 1 and len(figures) == 2 and len(breakdown) == len(STAGES)
        and all(_MS.fullmatch(v) for v in shown),
        "hung_up": run.get("button_after") == "Start call" and gone.get("status") == 404
        and gone.get("body", {}).get("error", {}).get("code") == "not_found",
        "no_page_errors": run.get("failed") is None and run.get("page_errors") == [],
    }  # fmt: skip
    return {name: bool(verdict[name]) for name in CHECKS}


def _table(run: dict[str, Any], verdict: dict[str, bool]) -> str:
    lines = [f"  {name:<20} {'ok' if ok else 'FAILED'}" for name, ok in verdict.items()]
    shown = run.get("figures", {})
    lines.append(f"  page: EoT -> first audio {shown.get('p50', '-')} (breakdown {run.get('breakdown', {})})")
    lines.append(f"  said: {run.get('user_text', '-')!r}; reply: {run.get('agent_text', '-')!r}")
    return "\n".join(["voice agent page", *lines, f"  failed at: {run['failed']}" if run["failed"] else ""])


@contextlib.contextmanager
def _target(args: argparse.Namespace) -> Iterator[str]:
    if args.url:
        yield args.url.rstrip("/")
        return
    env = {"LLM_EMBEDDED": "true", **settings_env(args.set, "voxgate bench page")}
    with ServerProcess("piper", env=env) as server:
        yield server.url


def run_page_bench(args: argparse.Namespace) -> int:
    if args.record_question:
        print(f"recorded: {question_wav(Path(args.record_question))}")
        return 0
    before = machine()
    with tempfile.TemporaryDirectory() as tmp, _target(args) as url:
        mic = Path(args.mic_wav) if args.mic_wav else question_wav(Path(tmp) / "question.wav")
        with open_browser(Path(args.chromium), mic) as browser:
            run = drive(browser, url, Path(args.screenshot) if args.screenshot else None)
            run["browser"] = browser.version
    verdict = checks(run)
    stamp = datetime.now(UTC)
    report = {"bench": "page", "date": stamp.isoformat(timespec="seconds"), "machine": before,
              "chromium": args.chromium, "ok": all(verdict.values()), "checks": verdict, "run": run}  # fmt: skip
    write_report(report, "page", stamp, args.output_json, _table(run, verdict))
    return 0 if report["ok"] else 1
