"""`voxgate bench parity`: voxgate's production path (bf16 on a GPU: the batched decoder's
CUDA graphs, fused sampler and kernels) against the official Qwen3-TTS in fp32.

Per prompt of the model's kind, the official fp32 model samples `--frames` frames (the
teacher codes, seeded); then the official model in bf16 and voxgate's decoder are fed those
same codes (teacher forcing, `parity_runs.py`), so each frame's logits compare like with like.
Figures, per frame and code: KL(fp32 || run) in nats and top-1 / top-k agreement for code 0
(the talker) and codes 1..15 (the code predictor); the PCM's SNR against the official fp32
decode of the codes. The yardstick is the official bf16 run: voxgate's errors must be no
larger (within `Tolerance`). Batch invariance: the first prompt alone, then in a bucket of
`--bucket` rows beside other streams, against the same fp32 reference and against itself alone.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from voxgate.bench.stats import add_codec_lean_argument, machine, write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="Qwen3-TTS-12Hz-0.6B-CustomVoice", help="config of the random checkpoint")
    parser.add_argument("--model-dir", default=None, help="an existing checkpoint instead of a random one")
    parser.add_argument("--configs", default=None, help="official configs folder (default ../shared/qwen3-tts)")
    parser.add_argument("--seed", type=int, default=7, help="random weights and the teacher's draws")
    parser.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (CPU tests)")
    parser.add_argument("--frames", type=int, default=100, help="teacher-forced frames per prompt (default 100)")
    parser.add_argument("--device", default="auto", help="cuda where there is one (default), else cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="voxgate's dtype")
    parser.add_argument("--bucket", type=int, default=64, help="batch-invariance bucket (0: skip)")
    parser.add_argument("--topk", type=int, default=10, help="k of the top-k agreement")
    parser.add_argument("--no-kernels", action="store_true", help="voxgate without the fused Triton kernels")
    add_codec_lean_argument(parser)
    parser.add_argument("--output-json", default=None)


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['kind']}: {result['frames']} frames ({', '.join(result['cases'])}), top-k k={result['topk']}",
             f"{'run':<24}{'code':<11}{'KL mean':>10}{'KL p99':>10}{'KL max':>10}{'top-1':>8}{'clear':>8}"
             f"{'top-k':>8}{'PCM SNR':>10}"]  # fmt: skip
    runs = [("official bf16", result["official_bf16"]), ("voxgate", result["voxgate"])]
    if "bucket" in result:
        runs.append((f"voxgate, {result['bucket']['rows']} rows", result["bucket"]["vs_fp32"]))
        runs.append(("bucket vs alone", result["bucket"]["vs_alone"]))
    for name, figures in runs:
        for part in ("code0", "predictor"):
            a = figures[part]
            snr = f"{figures['pcm_snr_db']:>8} dB" if part == "code0" else ""
            lines.append(f"{name:<24}{part:<11}{a['kl_mean']:>10.2e}{a['kl_p99']:>10.2e}{a['kl_max']:>10.2e}"
                         f"{a['top1']:>8.3f}{a.get('top1_clear', 1.0):>8.3f}{a['topk']:>8.3f}{snr:>10}")  # fmt: skip
    lines.append("holds: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["holds"].items()))
    return "\n".join(lines)


def run_parity_bench(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    import torch

    from voxgate.bench.parity_measure import checkpoint, measure

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    if args.device.startswith("cuda"):  # the fp32 reference is fp32: no TF32 in its matmuls or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = checkpoint(args, Path(scratch))
        result = measure(model_dir, args.device, dtype, args.frames, args.seed, args.bucket, args.topk,
                         not args.no_kernels, args.codec_lean)  # fmt: skip
    report = {"bench": "parity", "model": args.model_dir or args.model, "tiny": args.tiny, "seed": args.seed,
              "device": args.device, "dtype": args.dtype, "machine": machine(), "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None, **result}  # fmt: skip
    write_report(report, "parity", datetime.now(UTC), args.output_json, table(result))
    return 0 if all(result["holds"].values()) else 1


if __name__ == "__main__":  # `python -m voxgate.bench.parity`: with the parity bundle alone (bench/gpu_parity.sh)
    parser = argparse.ArgumentParser(prog="voxgate bench parity", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    raise SystemExit(run_parity_bench(parser.parse_args()))
