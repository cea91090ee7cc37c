"""`voxgate bench agent --questions multi`: the multi-sentence question set (issue 20) over
real WebRTC calls.

One call per question, so each question is judged alone: no history growing the prompt, and
no words of a reply nobody heard carried into the next question. An untimed warm-up call comes
first (whisper and the LLM's first run). The bot says the question (sentences joined by known
pauses), waits for a reply that starts after the last word (up to `--stuck-s`), listens to it
until its first audible audio and `SETTLE_S` more, then hangs up; `answers.summarise` judges the
calls with the server's turn traces.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from voxgate.bench.answers import Asked, summarise, table
from voxgate.bench.questions import (
    PIPER,
    SET_FILES,
    Question,
    RecordedSet,
    Recording,
    Speakers,
    available_voices,
    load_questions,
    record,
)
from voxgate.bench.questions import record_all as record_questions

AUDIBLE_RMS = 0.01
CALL_STARTED_S = 120.0  # the first call loads whisper (21 s seen at load 5)
FIRST_AUDIO_S = 30.0  # a started reply's first audible audio
SETTLE_S = 1.0  # listened after the reply's first audio: a further reply would start here
WARM_UP = Question("warm-up", "single", ("Hello, can you hear me?",), (), "Hello, can you hear me?")


def _reply_start(bot: Any, after: float) -> float | None:
    """Arrival of the last reply.start at or after `after`."""
    times = [t for t, e in bot.events if e.get("type") == "reply.start" and t >= after]
    return times[-1] if times else None


def _first_audible(bot: Any, after: float) -> float | None:
    loud = (r.t for r in bot.audio if r.t >= after and np.sqrt(np.mean(np.square(r.samples))) > AUDIBLE_RMS)
    return next(loud, None)


def _reply_over(bot: Any, after: float) -> bool:
    heard = _first_audible(bot, after) is not None
    return heard or any(e.get("type") == "reply.end" and t >= after for t, e in bot.events)


async def ask(url: str, rec: Recording, stuck_s: float) -> Asked:
    """One call: say `rec`, wait for the reply to it, hang up."""
    from voxgate.agent.bot import AgentBot

    bot = AgentBot()
    call_id = await bot.connect(url)
    try:
        await bot.wait_event("call.started", CALL_STARTED_S)
        said = await bot.say(rec.samples, rec.sample_rate)
        await bot.wait_for(lambda: _reply_start(bot, said) is not None, stuck_s)
        start = _reply_start(bot, said)
        if start is not None:
            await bot.wait_for(lambda: _reply_over(bot, start), FIRST_AUDIO_S)
        await asyncio.sleep(SETTLE_S)
    finally:
        await bot.hang_up()
    q = rec.question
    audible = _first_audible(bot, start) if start is not None else None
    return Asked(q.id, q.kind, rec.voice, q.expected, len(q.sentences), said, tuple(bot.events), audible, call_id)


async def ask_all(url: str, recordings: list[Recording], stuck_s: float, warm_up: Recording) -> list[Asked]:
    await ask(url, warm_up, stuck_s)
    asked = []
    for i, rec in enumerate(recordings):
        asked.append(await ask(url, rec, stuck_s))
        print(f"  {i + 1}/{len(recordings)} {rec.question.id} ({rec.voice})", flush=True)
    return asked


def recordings(
    limit: int, recorded: RecordedSet | None = None, name: str = "multi"
) -> tuple[list[Recording], Recording]:
    """The set `name` (multi, followup; its first `limit` questions when > 0) and the warm-up
    question, spoken by the voices available here, or read from a set recorded earlier
    (`voxgate bench agent --record-questions`, for a machine without espeak-ng or Piper)."""
    questions = load_questions(SET_FILES[name])
    questions = questions[:limit] if limit > 0 else questions
    if recorded is not None:
        return [recorded.get(q) for q in questions], recorded.get(WARM_UP)
    return record_questions(questions, available_voices()), record(WARM_UP, PIPER, Speakers())


def read_traces(trace_dir: Path, call_ids: list[str]) -> list[dict[str, Any]]:
    import json

    paths = [trace_dir / f"{c}.jsonl" for c in call_ids]
    return [json.loads(line) for p in paths if p.is_file() for line in p.read_text().splitlines()]


def run(args: argparse.Namespace, url: str, trace_dir: Path, same_host: bool) -> tuple[dict[str, Any], str]:
    """Ask the whole set; returns the report's body (summary, the calls, their traces) and its table."""
    recorded = RecordedSet(Path(args.questions_dir)) if args.questions_dir else None
    recs, warm_up = recordings(args.limit, recorded, args.questions)
    asked = asyncio.run(ask_all(url, recs, args.stuck_s, warm_up))
    time.sleep(0.5)  # the last call's trace line
    traces = read_traces(trace_dir, [a.call_id for a in asked])
    result = summarise(asked, traces, same_host, args.stuck_s)
    calls = [{"id": a.id, "voice": a.voice, "call_id": a.call_id, "said_at": a.said_at,
              "spans_s": r.spans_s, "duration_s": round(r.duration_s, 3),
              "events": [[round(t - a.said_at, 4), e] for t, e in a.events]}
             for a, r in zip(asked, recs, strict=True)]  # fmt: skip
    return {"summary": result, "calls": calls, "traces": traces}, table(result)
