"""What the agent did with each question of the multi-sentence set, from the bot's events and
the server's turn traces: pure functions, so the rules are tested on synthetic calls.

One call per question, so every event of the call belongs to it. Times are the bot's
`perf_counter` (event arrival, the last frame of the question sent); trace marks are the
server's `perf_counter`, comparable with the bot's only on the same host (CLOCK_MONOTONIC).

- premature end of turn: the agent announced an end of turn (`turn.end`, its VAD end mark)
  or started a reply before the question's last word was sent. Nothing the server sees before
  that moment can be the question's real end, so this needs no clock alignment.
- answered once: exactly one reply the user heard (some of its audio published) in the call,
  and it started after the last word (not stuck). A reply the agent started at an inner pause
  and cancelled before any of its audio went out (speech over it held it: the controller's
  `HoldAudio`) was never heard; it counts in `unheard`, not as an answer.
- stuck: no reply started within `stuck_s` of the last word.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from voxgate.bench.questions import words
from voxgate.bench.stats import summary

STAGES = ("stt_done", "llm_first_token", "first_segment", "tts_first_audio", "first_frame_published")
STUCK_S = 20.0


@dataclass(frozen=True, slots=True)
class Asked:
    """One question as the bot said it, and everything the agent sent back on its call."""

    id: str
    kind: str
    voice: str
    expected: str
    sentences: int
    said_at: float  # the question's last frame sent (bot clock)
    events: tuple[tuple[float, dict[str, Any]], ...]  # (arrival, event), the whole call
    first_audio_at: float | None  # the final reply's first audible audio at the bot
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    id: str
    kind: str
    voice: str
    multi: bool
    replies: int  # replies heard
    unheard: int  # replies started and cancelled before any of their audio was published
    premature: bool
    answered_once: bool
    stuck: bool
    dropped: int  # turns the agent dropped (empty or backchannel transcript)
    trace_id: str | None  # the final reply's turn (the last reply started)
    last_word_to_first_audio_ms: float | None  # at the bot


def _times(asked: Asked, kind: str) -> list[float]:
    return [t for t, e in asked.events if e.get("type") == kind]


def outcome(asked: Asked, stuck_s: float = STUCK_S, unheard: frozenset[str] = frozenset()) -> Outcome:
    """`unheard`: trace ids of replies none of whose audio was published (from the traces)."""
    said = asked.said_at
    started = [(t, e) for t, e in asked.events if e.get("type") == "reply.start"]
    starts = [(t, e) for t, e in started if e.get("trace_id") not in unheard]
    stuck = not any(t <= said + stuck_s for t, _ in started)
    audio = asked.first_audio_at
    return Outcome(
        id=asked.id,
        kind=asked.kind,
        voice=asked.voice,
        multi=asked.sentences > 1,
        replies=len(starts),
        unheard=len(started) - len(starts),
        premature=any(t < said for t in _times(asked, "turn.end") + [t for t, _ in started]),
        answered_once=len(starts) == 1 and starts[0][0] >= said and not stuck,
        stuck=stuck,
        dropped=len(_times(asked, "turn.dropped")),
        trace_id=starts[-1][1].get("trace_id") if starts else None,
        last_word_to_first_audio_ms=None if audio is None else round(1000 * (audio - said), 1),
    )


def _rate(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 3) if flags else None


def _group(outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "questions": len(outcomes),
        "answered_once_rate": _rate([o.answered_once for o in outcomes]),
        "premature_eot_rate": _rate([o.premature for o in outcomes]),
        "stuck": sum(o.stuck for o in outcomes),
        "replies": {str(n): sum(o.replies == n for o in outcomes) for n in sorted({o.replies for o in outcomes})},
        "unheard_replies": sum(o.unheard for o in outcomes),
    }


def breakdown(traces: list[dict[str, Any]], said_at: dict[str, float] | None = None) -> dict[str, Any]:
    """From each final reply's trace: vad_end -> each stage (p50/p95 ms); with `said_at` (trace
    id -> the question's last word, same host only) also last word -> vad_end."""
    timed = [t for t in traces if "vad_end" in t["marks"]]
    out = {f"eot_to_{stage}_ms": summary([1000 * (t["marks"][stage] - t["marks"]["vad_end"])
                                           for t in timed if stage in t["marks"]], 1)
           for stage in STAGES}  # fmt: skip
    if said_at is not None:
        out["last_word_to_vad_end_ms"] = summary(
            [1000 * (t["marks"]["vad_end"] - said_at[t["trace_id"]]) for t in timed if t["trace_id"] in said_at], 1
        )
    return out


def gaps(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """The gap each final reply kept after the user's voice (its trace's `gap_reason`: question,
    statement, opener; "none" from an agent without one) and its share of end of turn -> first
    frame: how long the reply's first audio waited past its first TTS audio (`audio_released`
    later than `tts_first_audio`: the gap, or voice not yet judged; 0 when it was ready later)."""
    timed = [t for t in traces if {"vad_end", "tts_first_audio", "first_frame_published"} <= t["marks"].keys()]
    held = [max(0.0, t["marks"].get("audio_released", 0.0) - t["marks"]["tts_first_audio"]) for t in timed]
    total = sum(t["marks"]["first_frame_published"] - t["marks"]["vad_end"] for t in timed)
    reasons = sorted({t.get("gap_reason") or "none" for t in timed})
    return {
        "replies": {r: sum((t.get("gap_reason") or "none") == r for t in timed) for r in reasons},
        "held_ms": summary([1000 * h for h in held], 1),
        "held_replies": sum(h > 0 for h in held),
        "held_share": round(sum(held) / total, 3) if total > 0 else None,
        "eot_to_first_frame_published_ms": {
            r: summary([1000 * (t["marks"]["first_frame_published"] - t["marks"]["vad_end"])
                        for t in timed if (t.get("gap_reason") or "none") == r], 1)
            for r in reasons
        },
    }  # fmt: skip


def word_recall(expected: str, heard: str) -> float:
    """Share of the expected words found in what the agent transcribed (each word once)."""
    want, got = words(expected), words(heard)
    hits = 0
    for w in want:
        if w in got:
            got.remove(w)
            hits += 1
    return hits / len(want) if want else 1.0


def summarise(
    asked: list[Asked], traces: list[dict[str, Any]], same_host: bool, stuck_s: float = STUCK_S
) -> dict[str, Any]:
    """The set's report: rates for the multi-sentence and the single-sentence questions, the
    latency breakdown of the replies that answered, per-question outcomes."""
    unheard = frozenset(t["trace_id"] for t in traces if "first_frame_published" not in t["marks"])
    outcomes = [outcome(a, stuck_s, unheard) for a in asked]
    by_id = {t["trace_id"]: t for t in traces}
    final = [by_id[o.trace_id] for o in outcomes if o.trace_id in by_id]
    said = {o.trace_id: a.said_at for o, a in zip(outcomes, asked, strict=True) if o.trace_id} if same_host else None
    recall = [word_recall(a.expected, by_id[o.trace_id].get("user", ""))
              for o, a in zip(outcomes, asked, strict=True) if o.trace_id in by_id]  # fmt: skip
    return {
        "multi": _group([o for o in outcomes if o.multi]),
        "single": _group([o for o in outcomes if not o.multi]),
        **breakdown(final, said),
        "last_word_to_first_audio_ms": summary(
            [o.last_word_to_first_audio_ms for o in outcomes if o.last_word_to_first_audio_ms is not None], 1
        ),
        "final_reply_word_recall": summary(recall, 3),
        "gap": gaps(final),
        "stuck_s": stuck_s,
        "outcomes": [asdict(o) for o in outcomes],
    }


def table(s: dict[str, Any]) -> str:
    lines = [
        "| questions | n | answered once | premature EoT | stuck | replies heard per question | started, never heard |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("multi", "single"):
        g = s[name]
        lines.append(f"| {name}-sentence | {g['questions']} | {g['answered_once_rate']} | {g['premature_eot_rate']} "
                     f"| {g['stuck']} | {g['replies']} | {g['unheard_replies']} |")  # fmt: skip
    lines += ["", "| final reply: from | n | p50 ms | p95 ms |", "|---|---|---|---|"]
    rows = [(f"end of turn (VAD) to {stage}", s[f"eot_to_{stage}_ms"]) for stage in STAGES]
    if "last_word_to_vad_end_ms" in s:
        rows.insert(0, ("last word to end of turn (VAD)", s["last_word_to_vad_end_ms"]))
    rows.append(("last word to first audible audio (bot)", s["last_word_to_first_audio_ms"]))
    lines += [f"| {name} | {v['n']} | {v['p50']} | {v['p95']} |" for name, v in rows]
    r = s["final_reply_word_recall"]
    lines.append(f"\nwords of the whole question in the final reply's transcript: p50 {r['p50']}, min {r['min']}")
    g = s.get("gap")
    if g:
        by = ", ".join(f"{k} {g['replies'][k]} (EoT -> first frame p50 {v['p50']} / p95 {v['p95']} ms)"
                       for k, v in g["eot_to_first_frame_published_ms"].items())  # fmt: skip
        lines.append(f"gap kept by the final replies: {by}; held past their first TTS audio: {g['held_replies']} "
                     f"replies, p95 {g['held_ms']['p95']} ms, {g['held_share']} of EoT -> first frame")  # fmt: skip
    return "\n".join(lines)
