"""Each captured bucket's decode step on a GPU, replayed many times: the cost a change to the
step adds or saves. Run it once per tree (PYTHONPATH) on one warm machine, alternating, and
compare medians.

    PYTHONPATH=<tree> python bench/qwen3_step_profile.py --model-dir CKPT --rows 128 --repeats 50
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    from voxgate.engines.qwen3.engine import Qwen3Engine
    from voxgate.engines.qwen3.loader import load_checkpoint

    ck = load_checkpoint(args.model_dir, "cuda", torch.bfloat16)
    t0 = time.perf_counter()
    engine = Qwen3Engine(ck, max_streams=args.rows)
    start_s = time.perf_counter() - t0
    try:
        with torch.inference_mode():  # as at start-up, where the buffers were made
            costs = engine.runner.decoder.profile(args.repeats)
    finally:
        engine.close()
    print(json.dumps({"label": args.label, "rows": args.rows, "start_s": round(start_s, 1),
                      "step_ms": {b: round(c * 1e3, 3) for b, c in costs.items()}}))  # fmt: skip


if __name__ == "__main__":
    main()
