"""`voxgate bench tts`: the qwen3 engine's TTFA, RTF and throughput, as JSON and a table.

Loads a checkpoint, starts the engine (on a GPU: the batched runner with its CUDA graphs),
warms up, then times whole requests through `Qwen3Engine.stream`, from the call to the first
PCM out (TTFA) and to the last (RTF = wall time / audio time). Every utterance has exactly
`--frames` frames (EOS is blocked, so random weights give a fixed length). Two tables:
1. one stream at a time, for each packet size;
2. N streams started together, for each concurrency: TTFA p50/p95, the worst stream's RTF,
   aggregate audio-seconds per wall-second, peak GPU memory.
`--peer faster-qwen3-tts` runs the peer on the same checkpoint in the same process for
side-by-side rows (see `voxgate.bench.peer`); `--peer faster-qwen3-tts-batch` runs the batched
peer on its own stack in a subprocess, a row beside each of our concurrency rows
(`voxgate.bench.peer_batch`).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voxgate.bench.peer_batch import PEER_BATCH, PeerUnavailable, ratios, run_batch_peer
from voxgate.bench.stats import add_codec_lean_argument, machine, percentile, write_report

TEXT = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods, "
    "where nobody will ever find it again."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, help="Qwen3-TTS checkpoint directory (official layout)")
    parser.add_argument("--frames", type=int, default=40, help="frames per utterance (80 ms each; default 40)")
    parser.add_argument("--packet-frames", default="1,4", help="packet sizes for the single-stream table (default 1,4)")
    parser.add_argument("--concurrency", default="", help="stream counts for the concurrency table, e.g. 1,4,16,64")
    parser.add_argument("--runs", type=int, default=3, help="timed requests per single-stream row (default 3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--no-graphs", action="store_true", help="batched decoding without CUDA graphs")
    parser.add_argument("--no-kernels", action="store_true", help="the GPU fast path without the fused Triton kernels")
    add_codec_lean_argument(parser)
    parser.add_argument("--mode", default="auto", choices=["auto", "batched", "eager"],
                        help="batched runner or one-stream eager path (auto: batched on a GPU only)")  # fmt: skip
    parser.add_argument("--compile", action="store_true", help="torch.compile the step before capture")
    parser.add_argument("--max-streams", type=int, default=0, help="batch rows (default: the largest concurrency)")
    parser.add_argument(
        "--peer",
        default=None,
        choices=["faster-qwen3-tts", "faster-qwen3-tts-batch"],
        help="also run this peer (the batched one: beside the --concurrency rows, CUDA only)",
    )
    parser.add_argument("--peer-site", default="/tmp/peer-site",
                        help="the batched peer's stack (pip install --target dir; bench/gpu_peer.sh)")  # fmt: skip
    parser.add_argument("--output-json", default=None)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _one(engine: Any, text: str, voice: str | None, seed: int, frames: int) -> dict[str, float]:
    from voxgate.types import CancelToken, SynthesisRequest

    instructions = None if voice else "A calm voice."  # VoiceDesign checkpoints have no speakers
    request = SynthesisRequest(text=text, voice=voice or "design", seed=seed, instructions=instructions)
    start = time.perf_counter()
    first = None
    samples = 0
    for chunk in engine.stream(request, CancelToken()):
        first = first if first is not None else time.perf_counter() - start
        samples += len(chunk.samples)
    wall = time.perf_counter() - start
    audio = samples / engine.sample_rate
    if samples != frames * engine.ck.codec.config.samples_per_frame:
        raise RuntimeError(f"expected {frames} frames, got {samples} samples")
    return {"ttfa_s": first or wall, "wall_s": wall, "audio_s": audio}


def _single(engine: Any, voice: str | None, args: argparse.Namespace, packet: int) -> dict[str, Any]:
    engine.packet_frames = packet
    _one(engine, TEXT, voice, 0, args.frames)  # warm-up
    runs = [_one(engine, TEXT, voice, i, args.frames) for i in range(args.runs)]
    ttfa = [r["ttfa_s"] * 1000 for r in runs]
    wall = statistics.median(r["wall_s"] for r in runs)
    return {
        "ttfa_ms_p50": round(statistics.median(ttfa), 1),
        "ttfa_ms_p95": round(percentile(ttfa, 95), 1),
        "rtf": round(wall / runs[0]["audio_s"], 4),
        "ms_per_frame": round(1000 * statistics.median(r["wall_s"] - r["ttfa_s"] for r in runs) / (args.frames - 1), 2),
    }


def _concurrent(engine: Any, voice: str | None, args: argparse.Namespace, n: int) -> dict[str, Any]:
    import torch

    engine.packet_frames = 1
    results: list[dict[str, float]] = []
    errors: list[str] = []
    gate = threading.Barrier(n + 1)

    def worker(i: int) -> None:
        gate.wait()
        try:
            results.append(_one(engine, TEXT, voice, 1000 + i, args.frames))
        except Exception as exc:  # reported, not raised: one failure must not hide the others' numbers
            errors.append(f"{type(exc).__name__}: {exc}")

    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    before = engine.counters().get("streams", {})
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttfa = [r["ttfa_s"] * 1000 for r in results]
    row: dict[str, Any] = {
        "streams": n,
        "errors": errors,
        "ttfa_ms_p50": round(statistics.median(ttfa), 1) if ttfa else None,
        "ttfa_ms_p95": round(percentile(ttfa, 95), 1) if ttfa else None,
        "worst_rtf": round(max(r["wall_s"] / r["audio_s"] for r in results), 4) if results else None,
        "audio_s_per_s": round(sum(r["audio_s"] for r in results) / wall, 1),
    }
    after = engine.counters().get("streams", {})
    if after:  # the runner's own view: mean wait in its queue before the prefill
        admitted = after["admitted"] - before["admitted"]
        row["queue_ms_mean"] = round(1000 * (after["queue_seconds"] - before["queue_seconds"]) / max(1, admitted), 1)
    if args.device.startswith("cuda"):
        row["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def run_tts_bench(args: argparse.Namespace) -> int:
    import torch

    from voxgate.engines.qwen3.config import SamplingParams
    from voxgate.engines.qwen3.engine import Qwen3Engine
    from voxgate.engines.qwen3.loader import load_checkpoint

    if args.threads:
        torch.set_num_threads(args.threads)
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    packets = [int(p) for p in args.packet_frames.split(",") if p]
    if args.peer == PEER_BATCH and (not concurrency or not args.device.startswith("cuda")):
        print(f"--peer {PEER_BATCH} needs --concurrency and --device cuda (its rows are batches on a GPU)")
        return 2
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    ck = load_checkpoint(
        Path(args.model_dir), args.device, dtype, fused_kernels=not args.no_kernels, codec_lean=args.codec_lean
    )
    load_s = time.perf_counter() - t0
    voice = next(iter(sorted(ck.config.talker.speaker_ids)), None)
    n = args.frames
    params = SamplingParams(min_new_tokens=n + 1, max_new_tokens=n + 1)  # exactly n frames
    print(f"loaded {ck.model_dir.name} ({args.device}, {args.dtype}) in {load_s:.1f} s; {n} frames per request")
    t1 = time.perf_counter()
    engine = Qwen3Engine(
        ck,
        sampling=params,
        cuda_graphs=not args.no_graphs,
        compile_graphs=args.compile,
        batched={"auto": None, "batched": True, "eager": False}[args.mode],
        max_streams=args.max_streams or max([1, *concurrency]),
        max_waiting=max([256, *concurrency]),
    )
    start_s = time.perf_counter() - t1
    mode = "eager" if engine.runner is None else "batched+graphs" if engine.eager_reason is None else "batched"
    print(f"engine ready in {start_s:.1f} s ({mode}{', fused kernels' if ck.talker.model.kernels else ''})", flush=True)
    result: dict[str, Any] = {"mode": mode, "fused_kernels": ck.talker.model.kernels, "compiled": args.compile,
                              "codec_lean": args.codec_lean,
                              "load_s": round(load_s, 2), "start_s": round(start_s, 1), "frames": n, "packets": {},
                              "concurrency": []}  # fmt: skip
    try:
        engine.warmup()
        for packet in packets:
            row = _single(engine, voice, args, packet)
            result["packets"][str(packet)] = row
            print(f"packet {packet}: TTFA p50 {row['ttfa_ms_p50']} ms, RTF {row['rtf']}", flush=True)
        for c in concurrency:
            row = _concurrent(engine, voice, args, c)
            result["concurrency"].append(row)
            print(f"{c} streams: TTFA p95 {row['ttfa_ms_p95']} ms, worst RTF {row['worst_rtf']}, "
                  f"{row['audio_s_per_s']} audio-s/s", flush=True)  # fmt: skip
        if args.device.startswith("cuda"):
            result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    finally:
        engine.close()
    if args.peer == PEER_BATCH:
        del engine
        torch.cuda.empty_cache()
        _batched_peer(args, result, voice, concurrency)
    elif args.peer:
        from voxgate.bench.peer import run_faster_qwen3_tts

        del engine
        torch.cuda.empty_cache() if args.device.startswith("cuda") else None
        peer = run_faster_qwen3_tts(str(args.model_dir), TEXT, voice, "english", n, packets, args.runs, args.device,
                                    args.dtype)  # fmt: skip
        result["peer"] = peer
        result["ratios"] = {
            p: {
                "ttfa": _ratio(peer["packets"].get(p, {}).get("ttfa_ms_p50"), row["ttfa_ms_p50"]),
                "rtf": _ratio(peer["packets"].get(p, {}).get("rtf"), row["rtf"]),
            }
            for p, row in result["packets"].items()
        }
    write_report(_report(args, ck, result), "tts", datetime.now(UTC), args.output_json, table(result))
    return 1 if "error" in result.get("peer", {}) else 0


def _batched_peer(args: argparse.Namespace, result: dict[str, Any], voice: str | None, streams: list[int]) -> None:
    """The batched peer's rows and the ratios into `result`; its failure too (ours are kept)."""
    try:
        peer = run_batch_peer(str(args.model_dir), TEXT, voice, "english", args.frames, streams, args.runs,
                              args.device, args.dtype, site=args.peer_site)  # fmt: skip
    except PeerUnavailable as e:
        print(e, flush=True)
        result["peer"] = {"peer": PEER_BATCH, "error": {"code": e.code, "message": str(e)}}
        return
    result["peer"], result["ratios"] = peer, {"streams": ratios(result["concurrency"], peer["concurrency"])}


def _ratio(peer: float | None, ours: float | None) -> float | None:
    """How many times better we are (peer / ours; > 1 means faster)."""
    return round(peer / ours, 2) if peer and ours else None


def _report(args: argparse.Namespace, ck: Any, result: dict[str, Any]) -> dict[str, Any]:
    import torch

    skip = ("func", "command", "bench")
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in skip and v not in
                     (None, False, ""))  # fmt: skip
    return {
        "bench": "tts",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"voxgate bench tts {flags}",
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
    }


def table(result: dict[str, Any]) -> str:
    """The result as Markdown tables (single stream per packet size; concurrency)."""
    lines = ["| packet frames | TTFA p50 ms | TTFA p95 ms | RTF | ms/frame |", "|---|---|---|---|---|"]
    peer = result.get("peer", {}).get("packets", {})
    for p, row in result["packets"].items():
        lines.append(f"| {p} | {row['ttfa_ms_p50']} | {row['ttfa_ms_p95']} | {row['rtf']} | {row['ms_per_frame']} |")
        if p in peer:
            other = peer[p]
            lines.append(f"| {p} (peer) | {other.get('ttfa_ms_p50')} | {other.get('ttfa_ms_p95')} | {other.get('rtf')} "
                         f"| {other.get('ms_per_frame')} |")  # fmt: skip
    if result["concurrency"]:
        lines += ["", "| streams | TTFA p50 ms | TTFA p95 ms | worst RTF | audio-s per s | peak GiB | errors |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        batched = {row["streams"]: row for row in result.get("peer", {}).get("concurrency", [])}
        for row in result["concurrency"]:
            lines.append(_concurrency_line(row, str(row["streams"])))
            if row["streams"] in batched:
                lines.append(_concurrency_line(batched[row["streams"]], f"{row['streams']} (peer)"))
    return "\n".join(lines)


def _concurrency_line(row: dict[str, Any], label: str) -> str:
    cells = [label, row.get("ttfa_ms_p50"), row.get("ttfa_ms_p95"), row.get("worst_rtf"), row.get("audio_s_per_s"),
             row.get("peak_gpu_gib", "-"), len(row["errors"])]  # fmt: skip
    return "| " + " | ".join(str(c) for c in cells) + " |"


if __name__ == "__main__":  # `python -m voxgate.bench.tts`: without the CLI's imports (bench/gpu_peer.sh's bundle)
    _parser = argparse.ArgumentParser(prog="python -m voxgate.bench.tts", description=__doc__.split("\n")[0])
    add_arguments(_parser)
    raise SystemExit(run_tts_bench(_parser.parse_args()))
