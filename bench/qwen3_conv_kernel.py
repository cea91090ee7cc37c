"""The codec's causal convolutions one by one: the Triton implicit product (`kernels.causal_conv`)
and the unfold kernel (`kernels.unfold`) against the unfolded product, on a GPU.

Every `CausalConv` of the codec decoder built from a real `speech_tokenizer/config.json`
(random weights, bf16) at its per-frame input shape, at each of `--rows`: the kernel's first
call (its compile), then each path's median time over `--repeats` calls (CUDA events), the
largest difference between the kernel's output and the unfolded one, and whether the gathered
path (`kernels.unfold`, then the same product) gives the unfolded output bit for bit. Progress
is printed as it goes; `--output-json` keeps it.

    python bench/qwen3_conv_kernel.py --config-root .gpu/qwen3-tts --rows 1,64,128 --output-json $OUT/conv.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from voxgate.engines.qwen3 import kernels, ops
from voxgate.engines.qwen3.checkpoint import default_config_root, randomise
from voxgate.engines.qwen3.codec import (
    CausalConv,
    CodecDecoder,
    CodecDecoderConfig,
    DecoderState,
    ResidualUnit,
    SnakeBeta,
)


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():  # a check of the script (TRITON_INTERPRET=1), not a figure
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


SWEEP = [(bm, bn, bk, w, 3) for bm in (64, 128) for bn in (64, 128) for bk in (32, 64) for w in (4, 8)]


def _measure(
    conv: CausalConv, act: SnakeBeta | None, rows: int, steps: int, c_in: int, repeats: int, sweep: bool = False
) -> dict:
    device, dtype = conv.conv.weight.device, conv.conv.weight.dtype
    g = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(rows, steps, c_in, device=device, generator=g).to(dtype)
    span = (conv.kernel - 1) * conv.dilation
    history = torch.randn(rows, span, c_in, device=device, generator=g).to(dtype)
    snake = act.derived() if act is not None else None
    (weight2d,) = conv.derived()
    f = (lambda v: kernels.snake_beta(v, *snake)) if snake else None

    def unfolded() -> torch.Tensor:
        return ops.causal_conv(x, history, weight2d, conv.conv.bias, conv.kernel, conv.dilation, f)[0]

    def fused() -> torch.Tensor:
        return kernels.causal_conv(x, history, conv.weight_kc(), conv.conv.bias, conv.dilation, snake)

    def gathered() -> torch.Tensor:
        if not span:  # a 1-tap conv has nothing to unfold: the unfold mode's own path
            return unfolded()
        return ops.linear(kernels.unfold(x, history, conv.kernel, conv.dilation, snake), weight2d, conv.conv.bias)

    t0 = time.perf_counter()
    got = fused()
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    tried = {}
    for tiles in SWEEP if sweep else []:

        def tiled(tiles=tiles) -> torch.Tensor:
            return kernels.causal_conv(x, history, conv.weight_kc(), conv.conv.bias, conv.dilation, snake, tiles=tiles)

        tiled()
        tried[",".join(map(str, tiles))] = round(_timed(tiled, repeats), 4)
    best = min(tried.items(), key=lambda kv: kv[1]) if tried else None
    return {"best_tiles": best, "swept": tried, "steps": steps, "c_in": c_in, "c_out": conv.conv.out_channels,
            "taps": conv.kernel, "dilation": conv.dilation, "act": snake is not None, "first_call_s": round(first_s, 3),
            "unfolded_ms": round(_timed(unfolded, repeats), 4), "fused_ms": round(_timed(fused, repeats), 4),
            "max_diff": (got.float() - unfolded().float()).abs().max().item(),
            "gathered_ms": round(_timed(gathered, repeats), 4),
            "gathered_exact": torch.equal(gathered(), unfolded())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-TTS-12Hz-0.6B-CustomVoice")
    parser.add_argument("--config-root", type=Path, default=None)
    parser.add_argument("--rows", default="1,64,128")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output-json", type=Path, default=None)
    parser.add_argument("--only", default="", help="convs whose key contains this (default: all)")
    parser.add_argument("--sweep", action="store_true", help="also try every tile set of SWEEP per layer shape")
    args = parser.parse_args()
    root = args.config_root or default_config_root()
    raw = json.loads((root / args.model / "speech_tokenizer/config.json").read_text())
    codec = CodecDecoder(CodecDecoderConfig.from_dict(raw["decoder_config"]))
    randomise(codec, torch.Generator().manual_seed(1))
    cuda = torch.cuda.is_available()
    codec.to("cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32).eval()
    acts = {m.conv1: m.act1 for m in codec.modules() if isinstance(m, ResidualUnit)}
    acts |= {m.conv2: m.act2 for m in codec.modules() if isinstance(m, ResidualUnit)}
    acts[codec.decoder[-1]] = codec.decoder[-2]
    shapes: dict[str, tuple[CausalConv, int, int]] = {}

    def keep(module, given):  # each conv's (steps, channels) for one frame
        shapes.setdefault(module.key, (module, given[0].shape[1], given[0].shape[2]))

    hooks = [m.register_forward_pre_hook(keep) for m in codec.modules() if isinstance(m, CausalConv)]
    with torch.inference_mode():
        codec.decode(torch.zeros(1, 16, 1, dtype=torch.long, device=codec.pre_conv.conv.weight.device), DecoderState())
    for h in hooks:
        h.remove()
    rows_out = []
    swept: set[tuple[int, ...]] = set()  # layer shapes already swept (the dilation matters: its own reads)
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            for key, (conv, steps, c_in) in shapes.items():
                if args.only not in key:
                    continue
                shape = (steps, c_in, conv.conv.out_channels, conv.kernel, conv.dilation)
                sweep = args.sweep and shape not in swept
                swept.add(shape)
                row = {
                    "rows": rows,
                    "conv": key,
                    **_measure(conv, acts.get(conv), rows, steps, c_in, args.repeats, sweep),
                }
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    for rows in sorted({r["rows"] for r in rows_out}):
        mine = [r for r in rows_out if r["rows"] == rows]
        total = {k: sum(r[k] for r in mine) for k in ("unfolded_ms", "fused_ms", "gathered_ms", "gathered_exact")}
        print(f"rows {rows}: unfolded {total['unfolded_ms']:.3f} ms, product kernel {total['fused_ms']:.3f} ms, "
              f"gathered {total['gathered_ms']:.3f} ms (exact in {total['gathered_exact']}) over {len(mine)} convs",
              flush=True)  # fmt: skip
    if args.output_json:
        args.output_json.write_text(json.dumps({"model": args.model, "convs": rows_out}, indent=1))


if __name__ == "__main__":
    main()
