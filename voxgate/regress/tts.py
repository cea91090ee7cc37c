"""Runs the text set through an engine in-process: streamed runs, a one-shot run, timings.

Streaming is the engine's stream collected chunk by chunk (timed: TTFA, wall); offline is
the same request synthesised in one piece where the engine has a knob for it (`tone`: all
units in one chunk; `qwen3`: all frames decoded as one packet), else the collected stream
again. Every request carries the same seed, so a deterministic engine repeats itself bit
for bit (piper drops its sampling noise for seeded requests).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from voxgate.config import Settings
from voxgate.engines.base import Engine, collect
from voxgate.regress.faults import FAULTS
from voxgate.regress.measure import CaseRecording
from voxgate.regress.texts import TextCase, texts_digest
from voxgate.types import CancelToken, SynthesisRequest

SEED = 42
INSTRUCTIONS = "A calm, clear voice."  # VoiceDesign checkpoints need one; other engines ignore it
_ONE_SHOT_KNOBS = ("packet_frames", "units_per_chunk")  # qwen3, tone

Progress = Callable[[str], None]


def engine_config(settings: Settings, engine: Engine, voice: str, cases: list[TextCase]) -> dict[str, Any]:
    """What decides the audio: the engine, its settings, voice, seed and texts. A golden
    baseline made under another config is not comparable (see `voxgate.regress.golden`)."""
    own = {k: v for k, v in settings.model_dump().items() if k.startswith(f"{engine.name}_")}
    if own.get("qwen3_model_dir") is not None:  # the checkpoint, not where it lies on this machine
        own["qwen3_model_dir"] = str(own["qwen3_model_dir"]).rstrip("/").rsplit("/", 1)[-1]
    own = {k: str(v) if v is not None and not isinstance(v, int | float | bool) else v for k, v in own.items()}
    return {"engine": engine.name, "sample_rate": engine.sample_rate, "voice": voice, "seed": SEED,
            "texts": texts_digest(cases), "settings": own}  # fmt: skip


def config_id(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def device(settings: Settings, engine_name: str) -> str:
    """Where the engine computes: `cuda` or `cpu` (only qwen3 can use a GPU)."""
    return settings.qwen3_device.split(":")[0] if engine_name == "qwen3" else "cpu"


def card(settings: Settings, engine_name: str) -> str:
    """The processor the audio was computed on: the GPU's name for a CUDA qwen3, else the CPU."""
    if device(settings, engine_name) == "cuda":
        import torch

        return torch.cuda.get_device_name()
    from voxgate.bench.stats import machine

    return str(machine()["cpu"] or "cpu")


def speaks(engine: Engine, voice: str, language: str) -> bool:
    info = next((v for v in engine.voices() if v.id == voice), None)
    return info is not None and ("*" in info.languages or language in info.languages)


@contextlib.contextmanager
def one_shot(engine: Engine) -> Iterator[None]:
    """The engine set to emit a whole utterance as one chunk, for as long as the block runs."""
    saved = {k: getattr(engine, k) for k in _ONE_SHOT_KNOBS if hasattr(engine, k)}
    try:
        for k in saved:
            setattr(engine, k, 1 << 30)
        yield
    finally:
        for k, v in saved.items():
            setattr(engine, k, v)


def _timed_stream(engine: Engine, request: SynthesisRequest) -> tuple[np.ndarray, float, float]:
    """(collected samples, seconds to the first chunk, seconds to the last)."""
    parts: list[np.ndarray] = []
    start = time.perf_counter()
    first = None
    for chunk in engine.stream(request, CancelToken()):
        first = time.perf_counter() - start if first is None else first
        parts.append(np.asarray(chunk.samples, dtype=np.float32))
    wall = time.perf_counter() - start
    samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return samples, wall if first is None else first, wall


def record_case(engine: Engine, case: TextCase, voice: str, runs: int, inject: str | None = None) -> CaseRecording:
    """`runs` streamed syntheses and one one-shot synthesis of a text; `inject` corrupts
    the streamed audio with a fault from `voxgate.regress.faults` (the harness's self-test)."""
    request = SynthesisRequest(text=case.text, voice=voice, language=case.language, seed=SEED,
                               instructions=INSTRUCTIONS, request_id=f"regress-{case.id}")  # fmt: skip
    rec = CaseRecording(case.id, engine.sample_rate, [], [], [])
    try:
        for _ in range(runs):
            samples, ttfa, wall = _timed_stream(engine, request)
            rec.runs.append(FAULTS[inject](samples, engine.sample_rate) if inject else samples)
            rec.ttfa_s.append(ttfa)
            rec.wall_s.append(wall)
        with one_shot(engine):
            rec.offline = collect(engine, request).samples
    except Exception as exc:  # a broken synthesis is a finding (gate audio_valid), not a crash
        rec.error = f"{type(exc).__name__}: {exc}"
    return rec


def record_all(
    engine: Engine, cases: list[TextCase], voice: str, runs: int, inject: str | None, progress: Progress
) -> tuple[list[CaseRecording], list[dict[str, str]]]:
    """Every case the voice can speak (the others are listed as skipped, with the reason)."""
    recordings, skipped = [], []
    for i, case in enumerate(cases, 1):
        if not speaks(engine, voice, case.language):
            skipped.append({"id": case.id, "reason": f"voice {voice} does not speak {case.language!r}"})
            progress(f"[{i}/{len(cases)}] {case.id}: skipped ({skipped[-1]['reason']})")
            continue
        started = time.perf_counter()
        rec = record_case(engine, case, voice, runs, inject)
        recordings.append(rec)
        audio_s = len(rec.runs[0]) / engine.sample_rate if rec.runs else 0.0
        status = rec.error or f"{audio_s:.2f} s of audio, TTFA {1000 * min(rec.ttfa_s, default=0):.0f} ms"
        progress(
            f"[{i}/{len(cases)}] {case.id}: {runs} runs + offline in {time.perf_counter() - started:.1f} s; {status}"
        )
    return recordings, skipped
