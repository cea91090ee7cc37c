"""From one text's recordings to its numbers, and from every text's numbers to the gates'.

Pure: audio arrays and timings in, plain dataclasses and dicts out. `measure_case` takes the
streamed runs of one text (the first is the one judged and kept), its one-shot (offline)
synthesis and, when a golden baseline exists, the baseline's audio of the same text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from voxgate.regress import signals
from voxgate.stats import percentile


@dataclass(slots=True)
class CaseRecording:
    """What the engine produced for one text."""

    case_id: str
    sample_rate: int
    runs: list[np.ndarray]  # streamed syntheses, each collected from its chunks
    ttfa_s: list[float]  # request -> first chunk, per streamed run
    wall_s: list[float]  # request -> last chunk, per streamed run
    offline: np.ndarray | None = None  # the one-shot synthesis
    error: str | None = None  # synthesis raised: "ExceptionType: message"


@dataclass(slots=True)
class CaseMetrics:
    case_id: str
    problems: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    unique_hashes: int = 0
    duration_s: float = 0.0
    offline_duration_s: float | None = None
    stream_vs_offline_ms: float | None = None
    ttfa_ms: list[float] = field(default_factory=list)
    rtf: float | None = None
    rms_dbfs: float | None = None
    repeat_s: float = 0.0
    repeat_at_s: tuple[float, float] | None = None
    pop_click: float = 0.0
    pop_click_at_s: float | None = None
    clipping: float = 0.0
    max_silence_gap_s: float = 0.0
    spikes: int = 0
    snr_vs_golden_db: float | None = None
    duration_vs_golden: float | None = None
    bit_exact_vs_golden: bool | None = None
    mel_distance_vs_golden_db: float | None = None


def measure_case(rec: CaseRecording, golden: np.ndarray | None = None, repeat_min_s: float = 0.3) -> CaseMetrics:
    """Every check on one text. Invalid audio (see `signals.audio_problems`) gets only its
    problems and hashes: the other measures would be meaningless on it."""
    m = CaseMetrics(rec.case_id, ttfa_ms=[1000 * t for t in rec.ttfa_s])
    if rec.error is not None or not rec.runs:
        m.problems = [f"engine_error: {rec.error or 'no runs'}"]
        return m
    sr = rec.sample_rate
    audio = rec.runs[0]
    m.hashes = [signals.pcm_hash(r) for r in rec.runs]
    m.unique_hashes = len(set(m.hashes))
    m.duration_s = signals.duration_s(audio, sr)
    m.problems = signals.audio_problems(audio, sr)
    if m.problems:
        return m
    if rec.offline is not None:
        m.offline_duration_s = signals.duration_s(rec.offline, sr)
        m.stream_vs_offline_ms = 1000 * abs(m.duration_s - m.offline_duration_s)
    if rec.wall_s and m.duration_s > 0:
        m.rtf = float(np.median(rec.wall_s)) / m.duration_s
    level = signals.rms(audio)
    m.rms_dbfs = 20 * math.log10(level) if level > 0 else None
    repeat = signals.find_repeat(audio, sr, min_s=repeat_min_s)
    m.repeat_s = repeat.duration_s
    m.repeat_at_s = (repeat.first_s, repeat.second_s) if repeat.duration_s else None
    clicks = signals.click_score(audio, sr)
    m.pop_click, m.pop_click_at_s = clicks.score, clicks.worst_s
    m.clipping = signals.clipping_ratio(audio)
    m.max_silence_gap_s = signals.max_silence_gap_s(audio, sr)
    m.spikes = signals.spikes(audio, sr).count
    if golden is not None and golden.size:
        heard, golden = signals.as_pcm16(audio), signals.as_pcm16(golden)  # as PCM16, as the golden WAV holds
        m.snr_vs_golden_db = signals.snr_db(golden, heard, sr)
        m.duration_vs_golden = abs(m.duration_s / signals.duration_s(golden, sr) - 1)
        m.bit_exact_vs_golden = signals.pcm_hash(golden) == m.hashes[0]
        m.mel_distance_vs_golden_db = signals.mel_distance_db(golden, heard, sr)
    return m


# per-text gates -> the CaseMetrics field each judges
CASE_GATES: dict[str, str] = {
    "snr_vs_golden": "snr_vs_golden_db",
    "duration_vs_golden": "duration_vs_golden",
    "stream_vs_offline": "stream_vs_offline_ms",
    "repeat": "repeat_s",
    "pop_click": "pop_click",
    "clipping": "clipping",
    "max_silence_gap": "max_silence_gap_s",
}
_LOWER_IS_WORSE = {"snr_vs_golden"}


def case_values(c: CaseMetrics) -> dict[str, float | None]:
    """One text's number for each per-text gate. Invalid audio is judged by `audio_valid`
    and `determinism` only (a NaN on one run only is itself non-determinism)."""
    values: dict[str, float | None] = {
        "audio_valid": float(bool(c.problems)),
        "determinism": float(c.unique_hashes) if c.hashes else None,
    }
    for gate, attr in CASE_GATES.items():
        value = None if c.problems else getattr(c, attr)
        values[gate] = None if value is None else float(value)
    return values


def gate_metrics(cases: Sequence[CaseMetrics]) -> tuple[dict[str, float | None], dict[str, str]]:
    """The number each tts gate judges and which text gave it: the count of invalid texts,
    the worst text's value for per-text gates, the p95 over every streamed run for TTFA."""
    per_case = {c.case_id: case_values(c) for c in cases}
    bad = [cid for cid, v in per_case.items() if v["audio_valid"]]
    metrics: dict[str, float | None] = {"audio_valid": float(len(bad))}
    where: dict[str, str] = {"audio_valid": ", ".join(bad)}
    for gate in ("determinism", *CASE_GATES):
        rows = [(v[gate], cid) for cid, v in per_case.items() if v[gate] is not None]
        pick = min if gate in _LOWER_IS_WORSE else max
        metrics[gate], where[gate] = pick(rows, key=lambda r: r[0]) if rows else (None, "")
    metrics["ttfa_p95"] = percentile([t for c in cases for t in c.ttfa_ms], 95)
    where["ttfa_p95"] = f"{sum(len(c.ttfa_ms) for c in cases)} runs"
    return metrics, where
