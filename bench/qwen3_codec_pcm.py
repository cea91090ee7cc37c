"""One tree's codec PCM for fixed codes, to compare two trees' decoders on one machine.

Decodes the same seeded codes through the incremental codec decoder of the checkpoint in
`--model-dir` (as the server loads it: bf16, lean, fused kernels on a GPU), frame by frame over
`--rows` rows of a fresh state, and saves the PCM (rows, frames * 1920) as a torch file; with
`--compare A B`, prints the largest difference between two saved runs.

    PYTHONPATH=<old tree> python bench/qwen3_codec_pcm.py --model-dir CKPT --output /tmp/old.pt
    PYTHONPATH=<new tree> python bench/qwen3_codec_pcm.py --model-dir CKPT --output /tmp/new.pt
    python bench/qwen3_codec_pcm.py --compare /tmp/old.pt /tmp/new.pt
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        a, b = (torch.load(p) for p in args.compare)
        diff, peak = (a - b).abs().max().item(), a.abs().max().item()
        print(f"codec PCM {tuple(a.shape)}: max |diff| {diff:.3g}, peak {peak:.3g}, identical {torch.equal(a, b)}")
        return
    from voxgate.engines.qwen3.codec import DecoderState
    from voxgate.engines.qwen3.loader import load_checkpoint

    gpu = args.device == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    codec = load_checkpoint(args.model_dir, device=args.device, dtype=dtype, codec_lean=True).codec
    codes = torch.randint(0, 2048, (args.rows, 16, args.frames), generator=torch.Generator().manual_seed(5))
    state = DecoderState()
    with torch.inference_mode():
        pcm = torch.cat([codec.decode(codes[..., i : i + 1].to(args.device), state) for i in range(args.frames)], -1)
    torch.save(pcm.float().cpu(), args.output)
    print(f"wrote {args.output}: {tuple(pcm.shape)}")


if __name__ == "__main__":
    main()
