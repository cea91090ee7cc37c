"""How many operations one incremental codec decode of one frame issues, by part of the decoder.

The codec decoder is built from a real `speech_tokenizer/config.json` (12 Hz; default: the
0.6B-CustomVoice one beside the repository) with random weights (counts do not depend on the
values), given a batched static state as `BatchDecoder` makes it (every row moving), and one
frame is decoded at each of `--rows`, counting aten ops with a dispatch mode
(`voxgate.bench.op_count`): ops that do work (each at least one GPU kernel) and free ones,
per part: quantizer, pre_conv, pre_transformer, upsample (transposed convs + ConvNeXt),
decoder (blocks), activation (every SnakeBeta), state (DecoderState writes), other.
`--lean` counts the lean path (`CodecDecoder.set_lean`, VOXGATE_QWEN3_CODEC_LEAN) instead,
`--both` counts both and gives the largest PCM difference between them (over all frames).

    python bench/qwen3_codec_ops.py --rows 1,8 --both --output-json $OUT/codec-ops.json

On a GPU (`--device cuda`) aten ops are counted the same way (the fused Snake kernel, `--fused`,
is a Triton launch, not an aten op), and the profiler counts a frame's GPU kernels
(`gpu_kernels`): the figure bench/qwen3_step_profile.py gives for its `codec` part.

    python bench/qwen3_codec_ops.py --device cuda --dtype bfloat16 --fused --rows 1,8,64 --both \
        --config-root .gpu/qwen3-tts   # on the device machine (bench/gpu_codec_lean.sh)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from voxgate.bench.op_count import OpCount, count_ops
from voxgate.engines.qwen3.checkpoint import default_config_root, randomise
from voxgate.engines.qwen3.codec import CodecDecoder, CodecDecoderConfig, DecoderState, SnakeBeta

PARTS = ("quantizer", "pre_conv", "pre_transformer", "upsample", "decoder", "activation", "state", "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-TTS-12Hz-0.6B-CustomVoice")
    parser.add_argument("--config-root", type=Path, default=None, help="default: ../shared/qwen3-tts")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--frames", type=int, default=3, help="frames decoded before the counted one")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--fused", action="store_true", help="the Triton Snake kernel (CUDA only)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--lean", action="store_true", help="count the lean path only")
    mode.add_argument("--both", action="store_true", help="count the plain and lean paths, compare PCM")
    parser.add_argument("--output-json", type=Path, default=None)
    args = parser.parse_args()
    root = args.config_root or default_config_root()
    raw = json.loads((root / args.model / "speech_tokenizer/config.json").read_text())["decoder_config"]
    codec = build_codec(CodecDecoderConfig.from_dict(raw), args.device, getattr(torch, args.dtype), args.fused)
    modes = [False, True] if args.both else [args.lean]
    report: dict[str, Any] = {"model": args.model, "device": args.device, "dtype": args.dtype,
                              "torch": torch.__version__, "fused_snake": args.fused, "counts": {}}  # fmt: skip
    for rows in (int(r) for r in args.rows.split(",") if r):
        pcm = {}
        for lean in modes:
            found, pcm[lean], kernels = count_frame(codec, rows, args.frames, lean)
            report["counts"][f"{rows}{'-lean' if lean else ''}"] = {**as_json(found), "gpu_kernels": kernels}
        if args.both:
            report.setdefault("max_abs_diff", {})[str(rows)] = float((pcm[True] - pcm[False]).abs().max())
    if args.output_json:
        args.output_json.parent.mkdir(parents=True, exist_ok=True)
        args.output_json.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))


def build_codec(cfg: CodecDecoderConfig, device: str, dtype: torch.dtype, fused: bool) -> CodecDecoder:
    codec = CodecDecoder(cfg)
    randomise(codec, torch.Generator().manual_seed(7), quiet=(".conv1.", ".conv2.", "block.1.conv"))
    codec = codec.to(device=device, dtype=dtype).eval()
    codec.fuse(kernels=fused)
    return codec


def codes_for(codec: CodecDecoder, rows: int, frames: int, seed: int = 0) -> torch.Tensor:
    cfg = codec.config
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.codebook_size, (rows, cfg.num_quantizers, frames), generator=g)


def batched_state(codec: CodecDecoder, rows: int) -> DecoderState:
    """A static per-row state, made as `BatchDecoder` makes its own."""
    device = next(codec.parameters()).device
    state = DecoderState()
    with torch.no_grad():
        codec.decode(torch.zeros(rows, codec.config.num_quantizers, 1, dtype=torch.long, device=device), state)
    state.freeze_rows(device, rows)
    return state


def count_frame(codec: CodecDecoder, rows: int, frames: int, lean: bool) -> tuple[OpCount, torch.Tensor, int | None]:
    """Decode `frames` frames (uncounted), then count one more; returns the counts, all PCM and,
    on a GPU, the kernels of a frame."""
    codec.set_lean(lean)
    device = next(codec.parameters()).device
    state = batched_state(codec, rows)
    moving = torch.ones(rows, dtype=torch.bool, device=device)
    codes = codes_for(codec, rows, frames + 1).to(device)
    pcm = []
    with torch.no_grad():  # not inference mode: there, composite ops reach the counter undecomposed
        for i in range(frames):
            pcm.append(codec.run(codes[..., i : i + 1], state.rows(rows, moving)))
        view = state.rows(rows, moving)
        with count_ops(parts(codec), {SnakeBeta: "activation"}, functions(codec)) as found:
            pcm.append(codec.run(codes[..., frames:], view))
        kernels = None
        if device.type == "cuda":  # a frame's GPU kernels, as the profiler sees them (one more frame: same ops)
            kernels = gpu_kernels(lambda: codec.run(codes[..., frames:], state.rows(rows, moving)))
    return found, torch.cat(pcm, dim=-1).float().cpu(), kernels


def gpu_kernels(call: Any) -> int:
    """GPU operations (kernels, copies, fills) of one call, by the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def parts(codec: CodecDecoder) -> dict[str, Any]:
    return {
        "pre_conv": codec.pre_conv,
        "pre_transformer": codec.pre_transformer,
        "upsample": [m for pair in codec.upsample for m in pair],
        "decoder": list(codec.decoder),
    }


def functions(codec: CodecDecoder) -> dict[str, tuple[Any, str]]:
    return {"quantizer": (codec.quantizer, "decode"), "state": (DecoderState, "put")}


def as_json(found: OpCount) -> dict[str, Any]:
    return {
        "ops": found.total,
        "free": sum(found.free.values()),
        "parts": {p: found.ops.get(p, 0) for p in PARTS},
        "names": {p: dict(found.names[p].most_common()) for p in PARTS if p in found.names},
    }


def table(report: dict[str, Any]) -> str:
    runs = list(report["counts"])
    lines = ["| part | " + " | ".join(f"rows {r}" for r in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for p in (*PARTS, "ops"):
        cells = [str(report["counts"][r]["parts"][p] if p != "ops" else report["counts"][r]["ops"]) for r in runs]
        lines.append(f"| {p if p != 'ops' else '**all (non-view)**'} | " + " | ".join(cells) + " |")
    lines.append("| free (views, empty) | " + " | ".join(str(report["counts"][r]["free"]) for r in runs) + " |")
    if any(report["counts"][r]["gpu_kernels"] is not None for r in runs):
        lines.append(
            "| GPU kernels (profiler) | " + " | ".join(str(report["counts"][r]["gpu_kernels"]) for r in runs) + " |"
        )
    if "max_abs_diff" in report:
        lines.append(f"\nlean vs default PCM, max |diff| per rows: {report['max_abs_diff']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
