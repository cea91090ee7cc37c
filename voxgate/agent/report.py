"""`voxgate agent --report`: the latency breakdown of voice-agent turns, from their trace files.

A trace file (one per call, written when VOXGATE_AGENT_TRACE_DIR is set) holds a JSON line
per finished turn: the controller's `TurnTrace` (`status`, `marks` as perf_counter seconds)
plus `call_id`. The stages are the gaps between consecutive marks from the end of the user's
turn (`vad_end`, the VAD's hangover already waited) to the reply's first frame on the track,
so they add up to EoT -> first audio. The hangover itself is a fixed wait before `vad_end`
that no mark records; the report shows the configured value beside them.

Barge-in: the gap from the start of the user's speech over a reply to that reply's `cancel`
mark (the cut turn's trace, then the interrupting turn's, in one file). Cancel -> silence:
from that `cancel` mark to `silence`, when the cut reply's last audio left the server (the
queued audio is flushed at once; the frame already on the wire plays out its 20 ms).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from voxgate.stats import percentile
from voxgate.types import VoxgateError


class TraceFileError(VoxgateError):
    code = "agent_bad_trace"


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    start: str  # mark names
    end: str


STAGES = (
    Stage("STT", "vad_end", "stt_done"),
    Stage("LLM TTFT", "stt_done", "llm_first_token"),
    Stage("first segment", "llm_first_token", "first_segment"),
    Stage("TTS first audio", "first_segment", "tts_first_audio"),
    Stage("publish", "tts_first_audio", "first_frame_published"),
    Stage("EoT -> first audio", "vad_end", "first_frame_published"),
    Stage("cancel -> silence", "cancel", "silence"),  # a cut reply's last audio out of the server
)
BARGE_IN = Stage("barge-in -> cancel", "interrupter's vad_start", "cancel")  # two turns: never read by _gap


@dataclass(frozen=True, slots=True)
class StageRow:
    stage: str
    span: str
    n: int
    p50_ms: float | None
    p95_ms: float | None


@dataclass(frozen=True, slots=True)
class Report:
    files: int
    calls: int
    turns: int
    statuses: dict[str, int]
    hangover_ms: float | None  # configured, not traced
    rows: tuple[StageRow, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_traces(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The turns of a trace file, or of every `*.jsonl` in a directory (in name order); and the file count."""
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
    elif path.is_file():
        files = [path]
    else:
        raise TraceFileError(f"{path}: no such file or directory")
    turns: list[dict[str, Any]] = []
    for file in files:
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceFileError(f"{file}: cannot read: {exc}") from exc
        turns += [_turn(line, f"{file}:{number}") for number, line in enumerate(lines, 1) if line.strip()]
    return turns, len(files)


def _turn(line: str, where: str) -> dict[str, Any]:
    try:
        turn = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFileError(f"{where}: not JSON ({exc.msg})") from exc
    if not isinstance(turn, dict) or not isinstance(turn.get("status"), str) or not isinstance(turn.get("marks"), dict):
        raise TraceFileError(f"{where}: not a turn trace (needs 'status' and 'marks')")
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in turn["marks"].values()):
        raise TraceFileError(f"{where}: marks must be numbers (seconds)")
    return turn


def summarise(turns: list[dict[str, Any]], hangover_ms: float | None = None, files: int = 1) -> Report:
    """n, p50 and p95 (ms) of each stage over the turns that have both its marks; statuses counted."""
    rows = [_row(stage, [_gap(t["marks"], stage) for t in turns]) for stage in STAGES]
    barge = [
        1000 * (turn["marks"]["cancel"] - after["marks"]["vad_start"])
        for turn, after in itertools.pairwise(turns)
        if turn["status"] == "interrupted" and turn.get("call_id") == after.get("call_id")
        and "cancel" in turn["marks"] and "vad_start" in after["marks"]
    ]  # fmt: skip
    rows.append(_row(BARGE_IN, barge))
    statuses = dict(Counter(t["status"] for t in turns).most_common())
    calls = len({t.get("call_id") for t in turns})
    return Report(files, calls, len(turns), statuses, hangover_ms, tuple(rows))


def _gap(marks: dict[str, float], stage: Stage) -> float | None:
    if stage.start in marks and stage.end in marks:
        return 1000 * (marks[stage.end] - marks[stage.start])
    return None


def _row(stage: Stage, gaps: list[float | None]) -> StageRow:
    values = [g for g in gaps if g is not None]
    p50, p95 = percentile(values, 50), percentile(values, 95)
    return StageRow(stage.name, f"{stage.start} -> {stage.end}", len(values),
                    None if p50 is None else round(p50, 1), None if p95 is None else round(p95, 1))  # fmt: skip


def format_table(report: Report) -> str:
    """The report as a Markdown table and a status line."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = ["| stage | marks | n | p50 ms | p95 ms |", "|---|---|---|---|---|"]
    if report.hangover_ms is not None:
        lines.append(f"| VAD hangover | (setting, before vad_end) | - | {ms(report.hangover_ms)} | - |")
    lines += [f"| {r.stage} | {r.span} | {r.n} | {ms(r.p50_ms)} | {ms(r.p95_ms)} |" for r in report.rows]
    statuses = ", ".join(f"{status} {count}" for status, count in report.statuses.items()) or "none"
    lines.append(f"\n{report.turns} turns in {report.calls} calls ({report.files} files); statuses: {statuses}")
    return "\n".join(lines)
