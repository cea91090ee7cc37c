"""The agent's ears on this machine: Silero VAD cost per 32 ms window, faster-whisper RTF.

Speech is the packaged piper voice saying a short turn and a longer passage. The VAD is
timed per window (the model call alone, and `StreamingVad.push` with framing and the
segmenter); whisper per utterance after one untimed warm-up call. Reported as medians over
`--runs`, written as JSON. Run: `python -m voxgate.bench.vad_stt [--runs 5] [--cpu-threads 2]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from voxgate.agent.stt import STT_RATE, WhisperConfig, WhisperTranscriber
from voxgate.agent.vad import SileroModel, StreamingVad
from voxgate.audio import resample
from voxgate.bench.quality import word_error_rate
from voxgate.bench.stats import machine, write_report

TEXTS = {
    "turn": "Please book a table for four people at seven tonight near the station.",
    "passage": (
        "The train to the coast leaves every hour from the second platform. Tickets can be bought on board, "
        "but they cost less at the machines in the main hall. On weekends the last train leaves at midnight."
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="timed runs per measure (default 5)")
    parser.add_argument("--model", default="tiny.en", help="whisper model: tiny.en, base or a directory")
    parser.add_argument("--cpu-threads", type=int, default=2, help="whisper CPU threads (default 2)")
    parser.add_argument("--beam-size", type=int, default=1, help="whisper beam size (default 1)")
    parser.add_argument("--output-json", default=None, help="where to write results (default bench/results/...)")


def speech(texts: dict[str, str]) -> dict[str, np.ndarray]:
    """Each text spoken by the packaged piper voice, at 16 kHz."""
    from voxgate.engines.base import collect
    from voxgate.engines.piper import PiperEngine
    from voxgate.types import SynthesisRequest

    engine = PiperEngine()
    voice = engine.voices()[0].id
    out = {}
    for name, text in texts.items():
        chunk = collect(engine, SynthesisRequest(text=text, voice=voice))
        out[name] = 0.5 * resample(chunk.samples, chunk.sample_rate, STT_RATE)
    return out


def bench_vad(audio: np.ndarray, runs: int) -> dict[str, Any]:
    """Median ms per 32 ms window: the model call alone, and the whole streaming path."""
    t0 = time.perf_counter()
    model = SileroModel()
    load_s = time.perf_counter() - t0
    windows = [audio[i : i + model.window] for i in range(0, audio.size - model.window + 1, model.window)]
    model_ms, stream_ms = [], []
    for _ in range(runs):
        model.reset()
        per_window = []
        for w in windows:
            t = time.perf_counter()
            model.probability(w)
            per_window.append(time.perf_counter() - t)
        model_ms.append(1000 * statistics.median(per_window))
        vad = StreamingVad(model=model)
        t = time.perf_counter()
        for i in range(0, audio.size, 320):  # 20 ms frames, as WebRTC delivers them
            vad.push(audio[i : i + 320])
        stream_ms.append(1000 * (time.perf_counter() - t) / len(windows))
    return {
        "load_s": round(load_s, 3),
        "windows": len(windows),
        "model_ms_per_window": round(statistics.median(model_ms), 4),
        "stream_ms_per_window": round(statistics.median(stream_ms), 4),
        "runs_model_ms": [round(x, 4) for x in model_ms],
        "runs_stream_ms": [round(x, 4) for x in stream_ms],
    }


def bench_whisper(clips: dict[str, np.ndarray], config: WhisperConfig, runs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    whisper = WhisperTranscriber(config)
    load_s = time.perf_counter() - t0
    whisper.warmup()
    rows = {}
    for name, audio in clips.items():
        took = []
        text = ""
        for _ in range(runs):
            heard = whisper.transcribe(audio, STT_RATE)
            took.append(heard.took_s)
            text = heard.text
        median = statistics.median(took)
        rows[name] = {
            "audio_s": round(audio.size / STT_RATE, 3),
            "took_s_p50": round(median, 3),
            "rtf_p50": round(median / (audio.size / STT_RATE), 3),
            "runs_took_s": [round(x, 3) for x in took],
            "wer": round(word_error_rate(TEXTS[name], text), 3),
            "text": text,
        }
    return {"load_s": round(load_s, 3), "clips": rows}


def run_vad_stt_bench(args: argparse.Namespace) -> int:
    stamp = datetime.now(UTC)
    clips = speech(TEXTS)
    silence = np.zeros(STT_RATE, dtype=np.float32)
    vad = bench_vad(np.concatenate([silence, clips["passage"], silence]), args.runs)
    config = WhisperConfig(model=args.model, cpu_threads=args.cpu_threads, beam_size=args.beam_size)
    whisper = bench_whisper(clips, config, args.runs)
    report = {
        "bench": "vad_stt",
        "time": stamp.isoformat(),
        "machine": machine(),
        "runs": args.runs,
        "whisper_config": {
            "model": args.model,
            "compute_type": config.compute_type,
            "cpu_threads": args.cpu_threads,
            "beam_size": args.beam_size,
        },
        "vad": vad,
        "whisper": whisper,
    }
    lines = [
        "| measure | median |",
        "|---|---|",
        f"| Silero VAD, model call per 32 ms window | {vad['model_ms_per_window']:.3f} ms |",
        f"| Silero VAD, StreamingVad.push per window (20 ms frames) | {vad['stream_ms_per_window']:.3f} ms |",
        f"| whisper {args.model} load | {whisper['load_s']:.2f} s |",
    ]
    for name, row in whisper["clips"].items():
        lines.append(
            f"| whisper {args.model} {name} ({row['audio_s']:.1f} s audio) | {row['took_s_p50']:.3f} s, "
            f"RTF {row['rtf_p50']:.3f}, WER {row['wer']:.2f} |"
        )
    lines.append(f"\nmachine: {report['machine']['cpu']}, {report['machine']['cores']} cores, "
                 f"load {report['machine']['load_avg_1m']} at the start")  # fmt: skip
    write_report(report, "vad-stt", stamp, args.output_json, "\n".join(lines))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m voxgate.bench.vad_stt", description=__doc__)
    add_arguments(parser)
    return run_vad_stt_bench(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
