"""The three rings of metrics of one reply (pure).

- Transport (what arrived, post-transport only): RMS, longest silence inside the reply,
  audible dropouts (sound cut dead, then back), clipping, pops/clicks, frame inter-arrival;
  with the engine's capture, the longest pause the way added (`align.added_gap_s`).
- Quality (engine output vs what arrived, windows aligned: `align.py`): log-mel distance,
  the 4-8 kHz energy share's drop, and the pace (speech heard / speech made).
- Latency: the user's end of words -> first audible frame at the probe (the PRIMARY KPI,
  on the bot's clock); from the agent's trace of the turn (`turn.trace` event, or its JSONL
  file), VAD end of turn -> first frame published, TTS first audio -> published, LLM time
  to first token, STT.

The capture status (`probe.Capture`) says which apply: transport needs audio that arrived
(OK, PRE_MISSING); quality needs both sides (OK), and the pace a reply not cut short.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from voxgate.audio import resample
from voxgate.regress import signals
from voxgate.regress.e2e import align
from voxgate.regress.e2e.probe import Capture, ReplyTake, capture_status

DROPOUT_FRAME_S = 0.005
DROPOUT_QUIET_RMS = 1e-3  # -60 dBFS: the sound is gone, not just soft
DROPOUT_FALL_DB = 30.0  # ... and it went within one 5 ms frame (speech fades; a loss cuts)
DROPOUT_MIN_S = 0.02
CLICK_THRESHOLD = 25.0  # click_score units: Piper speech peaks ~12 before and after WebRTC


@dataclass(slots=True)
class ReplyMetrics:
    case_id: str
    priority: str
    attempt: int
    reply_seq: int
    trace_id: str
    status: str | None
    capture: str
    # transport
    post_s: float = 0.0
    post_rms: float | None = None
    max_gap_ms: float | None = None
    added_gap_ms: float | None = None
    dropouts: int | None = None
    clipping_ratio: float | None = None
    clicks: int | None = None
    inter_arrival_p95_ms: float | None = None
    # quality
    mel_distance_db: float | None = None
    hf_drop_db: float | None = None
    drift_ratio: float | None = None
    # latency
    eot_to_first_audio_ms: float | None = None
    vad_end_to_published_ms: float | None = None
    tts_first_to_publish_ms: float | None = None
    llm_ttft_ms: float | None = None
    stt_ms: float | None = None


def dropouts(x: np.ndarray, rate: int) -> int:
    """Audible dropouts: runs of >= 20 ms below -60 dBFS that start with a fall of >= 30 dB
    within one 5 ms frame and end before the recording does (a cut, then sound again)."""
    level = signals.frame_rms(x, rate, DROPOUT_FRAME_S)
    quiet = level < DROPOUT_QUIET_RMS
    loud = DROPOUT_QUIET_RMS * 10 ** (DROPOUT_FALL_DB / 20)
    need = round(DROPOUT_MIN_S / DROPOUT_FRAME_S)
    edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
    runs = zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True)
    return sum(1 for s, e in runs if s > 0 and e < len(level) and e - s >= need and level[s - 1] >= loud)


def speech_part(x: np.ndarray, rate: int) -> np.ndarray:
    """From the first to the last speech frame (the reply's wait and tail left out)."""
    voiced = np.flatnonzero(signals.speech_frames(x, rate))
    if voiced.size == 0:
        return x[:0]
    n = round(signals.FRAME_S * rate)
    return x[voiced[0] * n : (voiced[-1] + 1) * n]


def transport(m: ReplyMetrics, take: ReplyTake) -> None:
    post, rate = take.post, take.rate
    words = speech_part(post, rate)
    m.post_rms = round(signals.rms(words), 4)
    m.max_gap_ms = round(1000 * signals.max_silence_gap_s(post, rate), 1)
    m.dropouts = dropouts(words, rate)
    m.clipping_ratio = round(signals.clipping_ratio(words), 6)
    m.clicks = signals.click_score(words, rate, threshold=CLICK_THRESHOLD).count
    if take.t_first_audio is not None:
        arrivals = take.arrivals[take.arrivals >= take.t_first_audio]
        if len(arrivals) > 2:
            m.inter_arrival_p95_ms = round(1000 * float(np.percentile(np.diff(arrivals), 95)), 1)


def quality(m: ReplyMetrics, take: ReplyTake, pre: np.ndarray) -> None:
    """`pre` at the take's rate."""
    post, rate = take.post, take.rate
    voiced = np.flatnonzero(signals.speech_frames(post, rate))
    heard_end = (voiced[-1] + 1) * round(signals.FRAME_S * rate) if voiced.size else 0
    matches = align.match_windows(pre, post, rate, post_end=heard_end if take.cut else None)
    mel = align.mel_distance_db(matches)
    m.mel_distance_db = None if mel is None else round(mel, 2)
    m.added_gap_ms = round(1000 * align.added_gap_s(matches, rate), 1)
    words = speech_part(post, rate)
    made = pre[: len(words)] if take.cut else pre  # a cut reply: as much as was heard
    m.hf_drop_db = round(signals.hf_ratio_drop_db(speech_part(made, rate), words, rate), 2)
    if not take.cut:
        drift = align.drift_ratio(pre, post, rate)
        m.drift_ratio = None if drift is None else round(drift, 4)


def latency(m: ReplyMetrics, take: ReplyTake, marks: dict[str, float] | None) -> None:
    """`marks`: the turn's trace in ms from its VAD end of turn (None: no trace)."""
    if take.t_first_audio is not None and take.t_eot is not None:
        m.eot_to_first_audio_ms = round(1000 * (take.t_first_audio - take.t_eot), 1)
    if not marks:
        return

    def span(a: str, b: str) -> float | None:
        return round(marks[b] - marks[a], 1) if a in marks and b in marks else None

    m.vad_end_to_published_ms = span("vad_end", "first_frame_published")
    # the track's own delay: from the engine's first audio, or from the controller's release of
    # audio it held on purpose (the minimum gap after the user's voice), whichever came later
    ready = max((k for k in ("tts_first_audio", "audio_released") if k in marks), key=marks.__getitem__, default="")
    m.tts_first_to_publish_ms = span(ready, "first_frame_published")
    m.llm_ttft_ms = span("stt_done", "llm_first_token")
    m.stt_ms = span("vad_end", "stt_done")


def measure(take: ReplyTake, priority: str, pre: tuple[np.ndarray, int] | None,
            marks: dict[str, float] | None) -> ReplyMetrics:  # fmt: skip
    """Every metric that applies to one reply, by its capture status."""
    pre_audio = None if pre is None else resample(pre[0], pre[1], take.rate) if pre[1] != take.rate else pre[0]
    capture = capture_status(take, pre_audio)
    m = ReplyMetrics(take.case_id, priority, take.attempt, take.reply_seq, take.trace_id, take.status, capture.value,
                     post_s=round(len(take.post) / take.rate, 3))  # fmt: skip
    if capture in (Capture.OK, Capture.PRE_MISSING):
        transport(m, take)
    if capture is Capture.OK and pre_audio is not None:
        quality(m, take, pre_audio)
    latency(m, take, marks)
    return m


def trace_marks(events: list[tuple[float, dict[str, Any]]], rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per trace id, marks in ms from vad_end: from `turn.trace` events, else from the
    agent's JSONL rows (perf_counter seconds)."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        marks, end = row.get("marks", {}), row.get("marks", {}).get("vad_end")
        if end is not None:
            out[row["trace_id"]] = {k: 1000 * (v - end) for k, v in marks.items()}
    for _, e in events:
        if e.get("type") == "turn.trace" and e.get("marks"):
            out[str(e.get("trace_id"))] = dict(e["marks"])
    return out
