"""Where the qwen3 engine's time to first audio goes when N streams start together (issue 17).

    python bench/qwen3_burst.py --model-dir CKPT [--device cuda] [--dtype bfloat16] [--streams 64]

Loads the engine as the server does (batched runner, CUDA graphs), warms it, times one prompt
build alone, then starts N streams at once from N threads (as the server's worker pool does)
and splits each stream's first audio into: prompt (to the talker prompt built), runner queue
(submitted to prefill), first frame (prefill to the first PCM frame handed out), and chunk
(to the first chunk yielded). Prints a table and writes JSON (--output-json). A diagnostic,
not a headline figure: `voxgate bench tts` gives the engine's TTFA.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from voxgate.config import Settings
from voxgate.engines.qwen3.engine import create
from voxgate.stats import percentile
from voxgate.types import CancelToken, SynthesisRequest

TEXT = "Sure, let me check that for you right now."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-thread", action="store_true", help="VOXGATE_QWEN3_PROMPT_THREAD on")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    settings = Settings(engine="qwen3", qwen3_model_dir=args.model_dir, qwen3_device=args.device,
                        qwen3_dtype=args.dtype, qwen3_max_streams=max(args.streams, 1),
                        qwen3_prompt_thread=args.prompt_thread, qwen3_batched=True)  # fmt: skip
    engine = create(settings)
    engine.warmup()
    voice = engine.voices()[0].id
    request = SynthesisRequest(text=TEXT, voice=voice, language="english")
    prompt_ms = []
    for _ in range(20):
        t = time.perf_counter()
        with engine._prompt_stream_context():
            engine._prompt(request, False)
        prompt_ms.append((time.perf_counter() - t) * 1000)

    marks: dict[int, dict[str, float]] = {}
    real_submit = engine.runner.submit

    def submit(job):  # type: ignore[no-untyped-def]  # on the asking thread, once its prompt is built
        marks[threading.get_ident()] = {"prompt": time.perf_counter(), "job": job}  # type: ignore[dict-item]
        return real_submit(job)

    engine.runner.submit = submit  # type: ignore[method-assign]
    rounds = []
    for _ in range(args.rounds):
        marks.clear()
        gate = threading.Barrier(args.streams + 1)
        rows: list[dict[str, float]] = []

        def worker(gate: threading.Barrier = gate, rows: list[dict[str, float]] = rows) -> None:
            gate.wait()
            t0 = time.perf_counter()
            chunks = engine.stream(request, CancelToken())
            first = next(chunks)
            m = marks[threading.get_ident()]
            job = m["job"]
            rows.append(
                {
                    "prompt": m["prompt"] - t0,
                    "queue": job.started_at - job.submitted_at,  # type: ignore[attr-defined]
                    "to_prefill": job.started_at - t0,
                    "first_chunk": first.t_ready - t0,
                }
            )  # type: ignore[attr-defined]
            for _ in chunks:
                pass

        threads = [threading.Thread(target=worker) for _ in range(args.streams)]
        for t in threads:
            t.start()
        gate.wait()
        for t in threads:
            t.join()
        rounds.append({k: {f"p{q}": round(1000 * (percentile([r[k] for r in rows], q) or 0), 2) for q in (50, 95)}
                       for k in rows[0]})  # fmt: skip
    result = {"streams": args.streams, "prompt_alone_ms_p50": round(percentile(prompt_ms, 50) or 0, 3),
              "rounds": rounds, "counters": engine.counters()}  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
