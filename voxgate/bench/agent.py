"""`voxgate bench agent`: voice-agent turns over a real WebRTC call, written as JSON.

Starts `voxgate serve` (Piper, embedded LLM, agent with per-call JSONL traces) unless `--url`
is given with `--trace-dir`, joins with the aiortc bot, and speaks `--turns` Piper-made
questions; every `--barge-every`-th turn the bot talks over the reply as soon as its audio
arrives. From the server's traces: EoT (VAD end of turn) -> STT done, LLM first token, first
segment, TTS first audio, first frame published (p50/p95), TTS first audio -> first frame
published, and turn statuses; from the bot: every completed reply audible (RMS floor).
`--questions multi` asks the multi-sentence set instead (issue 20: `agent_set`, `answers`), `followup`
the questions followed by more after a pause.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from voxgate.bench.questions import Question, RecordedSet, Recording, write_recordings
from voxgate.bench.server import ServerProcess, add_set_argument, settings_env
from voxgate.bench.stats import machine, summary, write_report

QUESTIONS = ["What is the capital of France?", "How do I boil an egg?", "Why is the sky blue?",
             "Recommend a good book.", "What should I cook tonight?"]  # fmt: skip
INTERRUPT = "Stop. Tell me about dogs instead."
STAGES = ("stt_done", "llm_first_token", "first_segment", "tts_first_audio", "first_frame_published")
AUDIBLE_RMS = 0.01


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=20, help="user turns (default 20)")
    parser.add_argument("--barge-every", type=int, default=5, help="talk over every Nth reply (default 5; 0: never)")
    parser.add_argument("--url", default=None, help="a running server (needs --trace-dir: its VOXGATE_AGENT_TRACE_DIR)")
    parser.add_argument("--trace-dir", default=None, help="where that server writes its call traces")
    parser.add_argument("--questions", choices=("basic", "multi", "followup"), default="basic",
                        help="basic: five Piper questions, --turns of them in one call; multi: the multi-sentence set "
                             "(issue 20; espeak-ng voices and Piper, one call per question); followup: questions "
                             "followed by more after a pause, as multi")  # fmt: skip
    parser.add_argument("--limit", type=int, default=0, help="multi: only the set's first N questions (default all)")
    parser.add_argument(
        "--questions-dir",
        default=None,
        help="say the questions recorded in this folder (--record-questions) instead of making them",
    )
    parser.add_argument("--record-questions", default=None, metavar="DIR",
                        help="record both sets' questions (espeak-ng voices and Piper) into DIR and exit: for a "
                             "machine that has neither (the GPU machine, bench/gpu_bundle_agent.sh)")  # fmt: skip
    parser.add_argument(
        "--stuck-s", type=float, default=20.0, help="multi: no reply this long after the question: stuck"
    )
    add_set_argument(parser)
    parser.add_argument("--output-json", default=None, help="where to write results (default bench/results/...)")


def basic_questions() -> list[Question]:
    """The basic set's questions and, last, the interruption, as single-sentence questions."""
    return [Question(f"basic-{i}", "single", (text,), (), text) for i, text in enumerate([*QUESTIONS, INTERRUPT])]


def basic_recordings(recorded: RecordedSet | None = None) -> list[Recording]:
    """`basic_questions()` said by the packaged Piper voice as it speaks them (no lead, its own
    level), or read from a recorded set."""
    if recorded is not None:
        return [recorded.get(q) for q in basic_questions()]
    from voxgate.engines.piper import PiperEngine
    from voxgate.types import CancelToken, SynthesisRequest

    engine = PiperEngine()
    voice = engine.voices()[0].id
    out = []
    for q in basic_questions():
        chunks = list(engine.stream(SynthesisRequest(text=q.expected, voice=voice), CancelToken()))
        samples, rate = np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate
        out.append(Recording(q, "piper", samples, rate, ((0.0, len(samples) / rate),)))
    return out


def record_sets(folder: Path) -> Path:
    """Every set (the multi-sentence set with its warm-up, the follow-up set, the basic one) into `folder`."""
    from voxgate.bench import agent_set

    multi, warm_up = agent_set.recordings(0)
    followup, _ = agent_set.recordings(0, name="followup")
    return write_recordings(folder, [*multi, *followup, warm_up, *basic_recordings()])


async def _call(url: str, turns: int, barge_every: int, speech: list[Recording]) -> dict[str, Any]:
    from voxgate.agent.bot import AgentBot

    *questions, interrupt = speech
    bot = AgentBot()
    call_id = await bot.connect(url)
    ends, audible, stuck = 0, [], 0
    try:
        for turn in range(turns):
            barge = barge_every > 0 and (turn + 1) % barge_every == 0
            q = questions[turn % len(questions)]
            said = await bot.say(q.samples, q.sample_rate)
            want = ends + 1
            if barge:
                await bot.wait_for(lambda s=said: _rms(bot.received_audio(since=s)[-1600:]) > AUDIBLE_RMS, 30)
                said = await bot.say(interrupt.samples, interrupt.sample_rate)
                want = ends + 2
            if not await bot.wait_for(lambda w=want: _count(bot, "reply.end") >= w, 60):
                stuck += 1
            ends = _count(bot, "reply.end")
            audible.append(_rms(bot.received_audio(since=said)))
            print(f"  turn {turn + 1}/{turns}{' (barge-in)' if barge else ''}", flush=True)
            await asyncio.sleep(0.5)
    finally:
        await bot.hang_up()
    return {"call_id": call_id, "stuck": stuck, "reply_rms": [round(r, 4) for r in audible],
            "events": [e for _, e in bot.events]}  # fmt: skip


def _count(bot: Any, kind: str) -> int:
    return sum(e.get("type") == kind for _, e in bot.events)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if len(x) else 0.0


def summarise(traces: list[dict[str, Any]], call: dict[str, Any]) -> dict[str, Any]:
    answered = [t for t in traces if "vad_end" in t["marks"] and "first_frame_published" in t["marks"]]
    out: dict[str, Any] = {"turns": len(traces), "status": {}}
    for t in traces:
        out["status"][t["status"]] = out["status"].get(t["status"], 0) + 1
    for stage in STAGES:
        out[f"eot_to_{stage}_ms"] = summary(
            [1000 * (t["marks"][stage] - t["marks"]["vad_end"]) for t in answered if stage in t["marks"]], 1
        )
    out["tts_first_audio_to_first_frame_ms"] = summary(
        [1000 * (t["marks"]["first_frame_published"] - _ready(t["marks"])) for t in answered
         if "tts_first_audio" in t["marks"]], 1)  # fmt: skip
    out["cancel_to_silence_ms"] = summary(
        [1000 * (t["marks"]["silence"] - t["marks"]["cancel"]) for t in traces
         if "silence" in t["marks"] and "cancel" in t["marks"]], 1)  # fmt: skip
    out["stuck_waits"] = call["stuck"]
    out["replies_below_rms_floor"] = sum(r <= AUDIBLE_RMS for r in call["reply_rms"])
    return out


def _ready(marks: dict[str, float]) -> float:
    """When the reply's audio could go out: its first TTS audio, or the controller's release of
    audio it held on purpose (the minimum gap after the user's voice) if later."""
    return max(marks["tts_first_audio"], marks.get("audio_released", marks["tts_first_audio"]))


def _table(s: dict[str, Any]) -> str:
    lines = ["| from end of turn (VAD) to | n | p50 ms | p95 ms |", "|---|---|---|---|"]
    for stage in STAGES:
        v = s[f"eot_to_{stage}_ms"]
        lines.append(f"| {stage} | {v['n']} | {v['p50']} | {v['p95']} |")
    v = s["tts_first_audio_to_first_frame_ms"]
    lines.append(f"| (tts_first_audio -> first_frame_published) | {v['n']} | {v['p50']} | {v['p95']} |")
    v = s["cancel_to_silence_ms"]
    lines.append(f"| (cancel -> silence, server) | {v['n']} | {v['p50']} | {v['p95']} |")
    lines.append(f"\nturn statuses {s['status']}; stuck waits {s['stuck_waits']}; "
                 f"replies below the RMS floor {s['replies_below_rms_floor']}")  # fmt: skip
    return "\n".join(lines)


@contextlib.contextmanager
def _target(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    """(server url, its trace dir): `--url`'s, or a `voxgate serve` started here (Piper, embedded LLM)."""
    if args.url:
        if not args.trace_dir:
            raise SystemExit("voxgate bench agent: --url needs --trace-dir (the server's VOXGATE_AGENT_TRACE_DIR)")
        yield args.url.rstrip("/"), Path(args.trace_dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        trace_dir = Path(args.trace_dir or tmp)
        env = {"LLM_EMBEDDED": "true", "AGENT_TRACE_DIR": str(trace_dir)}
        env.update(settings_env(args.set, "voxgate bench agent"))
        with ServerProcess("piper", env=env) as server:
            print(f"server ready at {server.url}", flush=True)
            yield server.url, trace_dir


def same_host(url: str | None) -> bool:
    """Whether the server's clock is this process's (a server started here, or on loopback):
    its trace marks and the bot's times are then on one monotonic clock."""
    if not url:
        return True
    host = urlsplit(url).hostname or ""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def _command(args: argparse.Namespace) -> str:
    if args.questions != "basic":
        shape = f"--questions {args.questions} --stuck-s {args.stuck_s:g}"
        shape += f" --limit {args.limit}" if args.limit else ""
    else:
        shape = f"--turns {args.turns} --barge-every {args.barge_every}"
    shape += f" --questions-dir {args.questions_dir}" if args.questions_dir else ""
    return f"voxgate bench agent {shape}" + "".join(f" --set {kv}" for kv in args.set)


def _basic(args: argparse.Namespace, url: str, trace_dir: Path) -> tuple[dict[str, Any], str]:
    speech = basic_recordings(RecordedSet(Path(args.questions_dir)) if args.questions_dir else None)
    call = asyncio.run(_call(url, args.turns, args.barge_every, speech))
    time.sleep(0.5)  # the call's last trace line
    path = trace_dir / f"{call['call_id']}.jsonl"
    traces = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    result = summarise(traces, call)
    return {"summary": result, "traces": traces, "call": call}, _table(result)


def run_agent_bench(args: argparse.Namespace) -> int:
    from voxgate.bench import agent_set

    if args.record_questions:
        print(f"recorded: {record_sets(Path(args.record_questions))}")
        return 0
    before = machine()
    with _target(args) as (url, trace_dir):
        if args.questions != "basic":
            body, table = agent_set.run(args, url, trace_dir, same_host=same_host(args.url))
        else:
            body, table = _basic(args, url, trace_dir)
    stamp = datetime.now(UTC)
    name = {"basic": "agent", "multi": "agent-questions"}.get(args.questions, f"agent-questions-{args.questions}")
    report = {"bench": name, "date": stamp.isoformat(timespec="seconds"), "command": _command(args),
              "machine": before, **body}  # fmt: skip
    write_report(report, name, stamp, args.output_json, table)
    return 0
