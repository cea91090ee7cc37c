"""One case as one real call: the `AgentBot` joins over WebRTC, waits for the ready barrier,
says each step (on cue: at the start, after the previous reply, or over it), and keeps
everything it heard with arrival times. Loop-only; the analysis (`probe.py`) is pure.

In this 1:1 design the bot is both the seeds' user bot and their probe bot: there is no
room, the agent's track goes to the one peer that called, so the audio the bot records is
the post-transport audio (after Opus, RTP, the jitter buffer). The ready barrier is the two
acknowledgements of the seeds' design, from the one peer: the agent's `call.started` event
(its driver runs) and the first frame of the agent's track (the probe hears it; the track
sends silence while the agent says nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voxgate.regress.e2e.cases import Case
from voxgate.regress.e2e.speech import Utterance
from voxgate.types import VoxgateError

AUDIBLE_RMS = 0.01  # a 20 ms frame louder than this (-40 dBFS) is the agent speaking
READY_TIMEOUT_S = 15.0
REPLY_TIMEOUT_S = 60.0  # per step: STT + LLM + the whole reply played in real time (2-core CPU)
END_PAD_S = 0.5  # audio still on its way when reply.end arrives (path + jitter buffer)


@dataclass(frozen=True, slots=True)
class Said:
    """One step as the bot said it (perf_counter times on the bot's clock)."""

    step: int
    t_start: float
    t_end: float  # the last frame left the mic track
    t_eot: float  # the words ended (t_end less the clip's trailing room tone)


@dataclass(slots=True)
class CallRecording:
    case_id: str
    attempt: int
    call_id: str | None = None
    t0: float = 0.0
    said: list[Said] = field(default_factory=list)
    audio: list[tuple[float, np.ndarray]] = field(default_factory=list)  # (arrival, float32 mono)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    record_rate: int = 24000
    error: str | None = None  # why the call did not run to the end (the recording is still kept)


def _count(bot: Any, kinds: tuple[str, ...]) -> int:
    return sum(e.get("type") in kinds for _, e in bot.events)


def unheard_replies(events: list[tuple[float, dict[str, Any]]]) -> set[str]:
    """Replies cut before any of their audio went out (no `reply.segment`): nobody heard them,
    and their turn goes on (the agent's words of it join the next turn), so they are no reply."""
    sounded = {e.get("trace_id") for _, e in events if e.get("type") == "reply.segment"}
    return {str(e.get("trace_id")) for _, e in events if e.get("type") == "reply.end"
            and e.get("status") == "interrupted" and e.get("trace_id") not in sounded}  # fmt: skip


def _turns_over(bot: Any) -> int:
    """Turns that ended with a reply heard (or not cut) or were dropped."""
    unheard = unheard_replies(bot.events)
    ends = [e for _, e in bot.events if e.get("type") == "reply.end" and e.get("trace_id") not in unheard]
    return len(ends) + _count(bot, ("turn.dropped",))


def _audible_since(bot: Any, since: float) -> bool:
    """Checked on every frame while waiting: newest first, stopping at `since` (the loop's
    time is the probe's clock; a slow check would delay the frames it timestamps)."""
    for r in reversed(bot.audio):
        if r.t < since:
            return False
        if float(np.sqrt(np.mean(np.square(r.samples)))) > AUDIBLE_RMS:
            return True
    return False


def _chunks(bot: Any) -> list[tuple[float, np.ndarray]]:
    return [(r.t, r.samples) for r in bot.audio]


async def run_call(url: str, case: Case, utterances: list[Utterance], attempt: int = 1,
                   record_rate: int = 24000, api_key: str | None = None) -> CallRecording:  # fmt: skip
    """Call the agent at `url` and play `case`; never raises for what the call does wrong
    (a missing reply, a timeout): that is in `error` and in what was recorded."""
    from voxgate.agent.bot import AgentBot

    rec = CallRecording(case.id, attempt, record_rate=record_rate, t0=time.perf_counter())
    bot = AgentBot(record_rate=record_rate, api_key=api_key)
    try:
        rec.call_id = await bot.connect(url)
        ready = lambda: _count(bot, ("call.started",)) > 0 and bool(bot.audio)  # noqa: E731
        if not await bot.wait_for(ready, READY_TIMEOUT_S):
            raise TimeoutError("ready barrier: no call.started event or no frame of the agent's track")
        await _play(bot, case, utterances, rec)
        await asyncio.sleep(END_PAD_S)
    except (TimeoutError, OSError, VoxgateError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            await bot.hang_up()
        rec.audio = _chunks(bot)
        rec.events = list(bot.events)
    return rec


async def _play(bot: Any, case: Case, utterances: list[Utterance], rec: CallRecording) -> None:
    for i, (step, utt) in enumerate(zip(case.steps, utterances, strict=True)):
        if step.when == "over_reply":
            since = rec.said[-1].t_end
            if not await bot.wait_for(lambda s=since: _audible_since(bot, s), REPLY_TIMEOUT_S):
                raise TimeoutError(f"step {i}: the agent never spoke, nothing to talk over")
        elif step.when == "after_reply":
            if not await bot.wait_for(lambda n=i: _turns_over(bot) >= n, REPLY_TIMEOUT_S):
                raise TimeoutError(f"step {i}: reply {i} did not end")
            await asyncio.sleep(0.3)  # a breath between turns
        t_start = time.perf_counter()
        t_end = await bot.say(utt.samples, utt.sample_rate)
        rec.said.append(Said(i, t_start, t_end, t_end - (utt.duration_s - utt.speech_end_s)))
    want = case.expected_replies  # a dropped turn gets no reply: it counts as ended
    if not await bot.wait_for(lambda: _turns_over(bot) >= want, REPLY_TIMEOUT_S):
        raise TimeoutError(f"{_count(bot, ('reply.end',))} of {want} replies ended")
