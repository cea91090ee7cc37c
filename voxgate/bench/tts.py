"""`voxgate bench tts`: the qwen3 engine's per-frame cost, TTFA and RTF, as JSON.

Loads a checkpoint, warms up, then for a fixed number of frames (EOS blocked, so random
weights give a fixed length) times: the prefill, code generation (talker + code predictor)
per frame, the incremental codec decode per packet, and the whole stream (TTFA = first PCM
out, RTF) for each packet size. The first run of each measurement is untimed warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voxgate.bench.stats import machine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, help="Qwen3-TTS checkpoint directory (official layout)")
    parser.add_argument("--frames", type=int, default=40, help="frames per utterance (80 ms each; default 40)")
    parser.add_argument("--packet-frames", default="1,4", help="packet sizes to time (default 1,4)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per measurement (default 3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--no-graphs", action="store_true", help="eager decode loop even on a GPU")
    parser.add_argument("--compile", action="store_true", help="torch.compile the graph bodies before capture")
    parser.add_argument("--output-json", default=None)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_tts_bench(args: argparse.Namespace) -> int:
    import torch

    from voxgate.engines.qwen3.codec import DecoderState
    from voxgate.engines.qwen3.config import SamplingParams
    from voxgate.engines.qwen3.generate import generate_codes
    from voxgate.engines.qwen3.graphs import StaticCodecStep, StaticDecoder
    from voxgate.engines.qwen3.loader import load_checkpoint
    from voxgate.engines.qwen3.prompt import PromptBuilder

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    ck = load_checkpoint(Path(args.model_dir), args.device, dtype)
    load_s = time.perf_counter() - t0
    speaker = next(iter(sorted(ck.config.talker.speaker_ids)), None)
    instruct = "A calm voice." if ck.config.model_type == "voice_design" else None
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    text = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."
    n = args.frames
    params = SamplingParams(seed=0, min_new_tokens=n + 1, max_new_tokens=n + 1)  # exactly n frames
    print(f"loaded {ck.model_dir.name} ({args.device}, {args.dtype}) in {load_s:.1f} s; {n} frames per run", flush=True)

    static = None
    if args.device.startswith("cuda") and not args.no_graphs:
        t1 = time.perf_counter()
        static = StaticDecoder(ck.talker, params, capacity=1024, compile_bodies=args.compile)
        print(f"captured CUDA graphs in {time.perf_counter() - t1:.1f} s", flush=True)

    def codes_once() -> tuple[float, float, Any]:
        _sync(args.device)
        start = time.perf_counter()
        prompt = builder.build(text, speaker=speaker, language="english", instruct=instruct)
        frames = static.generate(prompt, seed=0) if static else generate_codes(ck.talker, prompt, params)
        first = next(frames)
        _sync(args.device)
        t_first = time.perf_counter() - start
        rest = list(frames)
        _sync(args.device)
        return t_first, time.perf_counter() - start, torch.stack([first, *rest], dim=1)[None]

    steps: dict[int, Any] = {}

    def decode_once(codes: Any, packet: int) -> float:
        state = DecoderState()
        if static is not None and packet not in steps:
            steps[packet] = StaticCodecStep(ck.codec, packet)
        step = steps.get(packet)
        if step is not None:
            step.reset()
        _sync(args.device)
        start = time.perf_counter()
        for i in range(0, codes.shape[-1], packet):
            chunk = codes[..., i : i + packet]
            if step is not None:
                step.decode(chunk)
            else:
                ck.codec.decode(chunk, state)
        _sync(args.device)
        return time.perf_counter() - start

    codes_once()  # warm-up
    runs = [codes_once() for _ in range(args.runs)]
    codes = runs[-1][2]
    gen_first = statistics.median(r[0] for r in runs)
    gen_total = statistics.median(r[1] for r in runs)
    audio_s = n * 0.08
    result: dict[str, Any] = {
        "cuda_graphs": static is not None,
        "compiled": bool(static is not None and args.compile),
        "load_s": round(load_s, 2),
        "frames": n,
        "codes_first_frame_ms": round(1000 * gen_first, 1),
        "codes_ms_per_frame": round(1000 * (gen_total - gen_first) / max(1, n - 1), 2),
        "packets": {},
    }
    for packet in [int(p) for p in args.packet_frames.split(",")]:
        decode_once(codes, packet)  # warm-up
        dec = statistics.median(decode_once(codes, packet) for _ in range(args.runs))
        dec_first = decode_once(codes[..., :packet], packet)
        ttfa = gen_first + (result["codes_ms_per_frame"] / 1000) * (packet - 1) + dec_first
        total = gen_total + dec
        result["packets"][str(packet)] = {
            "decode_ms_per_frame": round(1000 * dec / n, 2),
            "ttfa_ms": round(1000 * ttfa, 1),
            "rtf": round(total / audio_s, 3),
        }
        print(f"packet {packet}: TTFA {1000 * ttfa:.0f} ms, RTF {total / audio_s:.3f}", flush=True)
    stamp = datetime.now(UTC)
    report = {
        "bench": "tts",
        "date": stamp.isoformat(timespec="seconds"),
        "command": "voxgate bench tts " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                   if k not in ("func", "command", "bench") and v is not None),
        "machine": {
            **machine(),
            "torch": torch.__version__,
            "device": args.device,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "dtype": args.dtype,
        },
        "model": ck.model_dir.name,
        "model_type": ck.config.model_type,
        "result": result,
    }  # fmt: skip
    out = Path(args.output_json or f"bench/results/tts-{stamp:%Y%m%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0
