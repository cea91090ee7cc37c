"""The codec's convs that follow an activation, one by one on a GPU: the implicit product over
the [history | input] buffer (`kernels.conv_taps`) against the unfolded product it replaces.

Every `CausalConv` of the codec decoder built from a real `speech_tokenizer/config.json` (random
weights, bf16) that `CausalConv.activated` runs, at its per-frame input shape, at each of
`--rows`: each path's median time over `--repeats` calls (CUDA events), the largest difference
between them, and with `--sweep` every tile set of SWEEP (once per layer shape and rows) with the best.
Progress is printed as it goes; `--output-json` keeps it.

    python bench/qwen3_conv_taps.py --config-root .gpu/qwen3-tts --rows 1,128 --sweep --output-json $OUT/taps.json
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
from voxgate.engines.qwen3.codec import CausalConv, CodecDecoder, CodecDecoderConfig, DecoderState

TILE_SIZES = [(bm, bn, bk) for bm in (64, 128, 256) for bn in (64, 128) for bk in (32, 64)]
SWEEP = [(*size, w, s) for size in TILE_SIZES for w in (4, 8) for s in (3, 4)]


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


def _measure(conv: CausalConv, rows: int, steps: int, repeats: int, sweep: bool) -> dict:
    weight2d, taps_form = conv.derived()
    device, dtype = weight2d.device, weight2d.dtype
    c_in, c_out = conv.conv.in_channels, conv.conv.out_channels
    span = (conv.kernel - 1) * conv.dilation
    full = torch.randn(rows, span + steps, c_in, device=device, generator=torch.Generator(device).manual_seed(2))
    full = full.to(dtype)
    bias = conv.conv.bias

    def unfolded() -> torch.Tensor:
        return ops.unfolded_conv(full, weight2d, bias, conv.kernel, conv.dilation)[0]

    def taps(tiles=None) -> torch.Tensor:
        return kernels.conv_taps(full, taps_form, bias, conv.kernel, conv.dilation, tiles)

    t0 = time.perf_counter()
    got = taps()
    if device.type == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    tried = {}
    usable = [t for t in SWEEP if c_in % t[2] == 0] if sweep else []
    for tiles in usable:
        taps(tiles)
        tried[",".join(map(str, tiles))] = round(_timed(lambda tiles=tiles: taps(tiles), repeats), 4)
    best = min(tried.items(), key=lambda kv: kv[1]) if tried else None
    m = rows * steps
    return {"steps": steps, "c_in": c_in, "c_out": c_out, "taps": conv.kernel, "dilation": conv.dilation,
            "gflop": round(2 * m * c_in * c_out * conv.kernel / 1e9, 3), "first_call_s": round(first_s, 3),
            "default_tiles": ",".join(map(str, kernels.conv_taps_tiles(m, c_in, c_out))),
            "unfolded_ms": round(_timed(unfolded, repeats), 4), "taps_ms": round(_timed(taps, repeats), 4),
            "max_diff": (got.float() - unfolded().float()).abs().max().item(),
            "best_tiles": best, "swept": tried}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen3-TTS-12Hz-0.6B-CustomVoice")
    parser.add_argument("--config-root", type=Path, default=None)
    parser.add_argument("--rows", default="1,128")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sweep", action="store_true", help="also try every tile set of SWEEP per layer shape")
    parser.add_argument("--output-json", type=Path, default=None)
    args = parser.parse_args()
    root = args.config_root or default_config_root()
    raw = json.loads((root / args.model / "speech_tokenizer/config.json").read_text())
    codec = CodecDecoder(CodecDecoderConfig.from_dict(raw["decoder_config"]))
    randomise(codec, torch.Generator().manual_seed(1))
    cuda = torch.cuda.is_available()
    codec.to("cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32).eval()
    codec.fuse(kernels=True)
    shapes: dict[str, tuple[CausalConv, int]] = {}  # each activated conv's steps for one frame
    convs = [m for m in codec.modules() if isinstance(m, CausalConv) and m.kernel > 1]
    for conv in convs:  # `activated` is no forward (no hook): wrapped for one decode

        def noted(x, act, state, conv=conv, through=conv.activated):
            shapes.setdefault(conv.key, (conv, x.shape[1]))
            return through(x, act, state)

        conv.activated = noted
    with torch.inference_mode():
        codec.decode(torch.zeros(1, 16, 1, dtype=torch.long, device=codec.pre_conv.conv.weight.device), DecoderState())
    for conv in convs:
        del conv.activated
    out = []
    swept: set[tuple[int, ...]] = set()
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            for key, (conv, steps) in shapes.items():
                shape = (rows, steps, conv.conv.in_channels, conv.conv.out_channels)  # the dilation: same tiles
                sweep = args.sweep and shape not in swept
                swept.add(shape)
                row = {"rows": rows, "conv": key, **_measure(conv, rows, steps, args.repeats, sweep)}
                out.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "swept"}), flush=True)
                if args.output_json:  # as it goes: a run cut short keeps what it measured
                    args.output_json.write_text(json.dumps({"model": args.model, "convs": out}, indent=1))
    for rows in sorted({r["rows"] for r in out}):
        mine = [r for r in out if r["rows"] == rows]
        best = sum(r["best_tiles"][1] for r in mine if r["best_tiles"]) if all(r["best_tiles"] for r in mine) else None
        print(f"rows {rows}: unfolded {sum(r['unfolded_ms'] for r in mine):.3f} ms, conv_taps "
              f"{sum(r['taps_ms'] for r in mine):.3f} ms" + (f" (best tiles: {best:.3f} ms)" if best else "")
              + f" over {len(mine)} convs", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
