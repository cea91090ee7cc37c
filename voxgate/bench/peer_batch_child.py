"""The batched peer's own process: faster-qwen3-tts-batch 0.2.0 timed on its own stack.

`voxgate bench tts --peer faster-qwen3-tts-batch` (`peer_batch.py`) starts this module with
PYTHONPATH = the peer's `--target` site dir first (transformers 4.57.3, qwen-tts 0.1.1,
faster-qwen3-tts 0.5.4, faster-qwen3-tts-batch 0.2.0; bench/gpu_bundle_peer.sh), so nothing of
voxgate's own stack is imported here: the standard library, torch, numpy and the peer only.

Protocol: arguments in (`main`), one JSON file out (`--output-json`), exit 0:
    {"versions": {...}, "model_type", "speaker", "load_s",
     "batches": [{"streams": n, "peak_gpu_gib", "warmup_s", "runs": [{"wall_s",
                  "streams": [{"ttfa_s", "audio_s", "frames"}, ...]}, ...]}
                 or {"streams": n, "error": "..."}]}
or {"error": {"code", "message"}} and exit 2 (`cuda_only`, `peer_missing`, `no_cuda`,
`unsupported_checkpoint`, `load_failed`). The parent summarises the runs.

What is timed is the peer's own batch call (`BatchedFasterQwen3TTS.generate_voice_clone_batch`,
its only public batched API, made for voice clones), with the prompts of a CustomVoice or
VoiceDesign checkpoint built by faster-qwen3-tts (`_prepare_generation_custom`, as its
`generate_custom_voice` does) instead of a clone's: n prompts built, one batched generation of
exactly `frames` frames (EOS blocked until then, stopped there), then each stream's codes decoded
in turn. The peer is offline, so a stream's first audio is its whole audio, on the host.

The peer's graphs are captured for one batch size (`max_batch_size`, padded rows compute too), so
each batch size gets its own wrapper over the one loaded model, as a user would size it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

from voxgate.bench.import_stubs import stub_missing

PEER = "faster-qwen3-tts-batch"
DISTRIBUTIONS = ("faster-qwen3-tts-batch", "faster-qwen3-tts", "qwen-tts", "transformers", "tokenizers",
                 "huggingface-hub", "accelerate", "torch")  # fmt: skip
VOICE_DESIGN_INSTRUCT = "A calm voice."
# The peer's predictor graph is captured with these (top-k 50, temperature 0.9, sampling on); the
# talker uses the same, with faster-qwen3-tts's default repetition penalty.
SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "do_sample": True, "repetition_penalty": 1.05}


class ChildError(Exception):
    """A failure the parent is told about as {"error": {"code", "message"}}."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def shim_lazy_initialization() -> bool:
    """faster-qwen3-tts 0.5.4 calls `layer.lazy_initialization(k, v)` (transformers 5); 4.57's
    StaticLayer takes the key states only. The one-line shim: accept and drop the second.
    Returns whether it was needed."""
    from transformers.cache_utils import StaticLayer

    original = StaticLayer.lazy_initialization
    if len(inspect.signature(original).parameters) != 2:  # self, key_states
        return False
    StaticLayer.lazy_initialization = lambda self, key_states, value_states=None: original(self, key_states)
    return True


def import_peer() -> tuple[Any, Any, Any]:
    """The peer's base model class, batched wrapper and batched loop (stand-ins for what the
    12 Hz path never calls); `peer_missing` names the package that did not import."""
    stub_missing()
    try:
        from faster_qwen3_tts import FasterQwen3TTS
        from faster_qwen3_tts_batch import BatchedFasterQwen3TTS
        from faster_qwen3_tts_batch.batched_generate import batched_fast_generate

        shim_lazy_initialization()
    except ImportError as e:
        raise ChildError("peer_missing", f"{e} (sys.path[0] = {sys.path[0]})") from e
    return FasterQwen3TTS, BatchedFasterQwen3TTS, batched_fast_generate


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for dist in DISTRIBUTIONS:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


class BatchRunner:
    """One loaded peer model; `run(n)` is one timed batch of n streams."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.torch, self.args = torch, args
        base_cls, self.wrapper_cls, self.generate = import_peer()
        if not torch.cuda.is_available():
            raise ChildError("no_cuda", f"{PEER} needs a CUDA GPU; torch sees none")
        self.max_seq_len = args.max_seq_len
        t0 = time.perf_counter()
        try:
            dtype, length = getattr(torch, args.dtype), self.max_seq_len
            self.base = base_cls.from_pretrained(args.model_dir, device=args.device, dtype=dtype, max_seq_len=length)
        except Exception as e:
            raise ChildError("load_failed", f"{type(e).__name__}: {e}") from e
        torch.cuda.synchronize()
        self.load_s = time.perf_counter() - t0
        official = self.base.model
        self.kind = official.model.tts_model_type
        self.speaker, self.instruct = args.speaker, None
        if self.kind == "custom_voice":
            self.speaker = self.speaker or (official.get_supported_speakers() or [None])[0]
        elif self.kind == "voice_design":
            self.speaker, self.instruct = None, VOICE_DESIGN_INSTRUCT
        else:
            raise ChildError("unsupported_checkpoint", f"a {self.kind!r} checkpoint needs reference audio")
        self.wrapper: Any = None

    def size(self, n: int) -> None:
        """A wrapper whose graphs are captured for n rows (the previous one freed first)."""
        self.wrapper = None
        gc.collect()
        self.torch.cuda.empty_cache()
        self.wrapper = self.wrapper_cls(self.base, max_batch_size=n, max_seq_len=self.max_seq_len)

    def _prompt(self) -> tuple[Any, ...]:
        return self.base._prepare_generation_custom(text=self.args.text, language=self.args.language,
                                                    speaker=self.speaker, instruct=self.instruct,
                                                    non_streaming_mode=True)  # fmt: skip

    def run(self, n: int, seed: int) -> dict[str, Any]:
        """n streams started together: prompts, one batched generation, each decoded in turn."""
        torch, frames = self.torch, self.args.frames
        torch.manual_seed(seed)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            prompts = [self._prompt() for _ in range(n)]
            m = prompts[0][0]
            if not self.wrapper._warmed_up:
                self.wrapper.warmup(prefill_len=max(p[3].shape[1] for p in prompts))
            results = self.generate(
                talker=m.talker, talker_input_embeds_list=[p[3] for p in prompts],
                attention_mask_list=[p[4] for p in prompts], trailing_text_hiddens_list=[p[5] for p in prompts],
                tts_pad_embed=prompts[0][6], config=m.config.talker_config,
                predictor_graph=self.wrapper.batched_predictor_graph, talker_graph=self.wrapper.batched_talker_graph,
                max_new_tokens=frames, min_new_tokens=frames, **SAMPLING,
            )  # fmt: skip
            streams = []
            for codes, _timing in results:
                if codes is None:
                    streams.append({"ttfa_s": None, "audio_s": 0.0, "frames": 0})
                    continue
                audio, rate = m.speech_tokenizer.decode({"audio_codes": codes.unsqueeze(0)})
                samples = sum(len(a.flatten().cpu().numpy() if hasattr(a, "cpu") else a.flatten()) for a in audio)
                streams.append({"ttfa_s": time.perf_counter() - start, "audio_s": samples / rate,
                                "frames": int(codes.shape[0])})  # fmt: skip
        return {"wall_s": time.perf_counter() - start, "streams": streams}

    def batch(self, n: int, runs: int) -> dict[str, Any]:
        """A warm-up (graph capture) and `runs` timed batches of n streams."""
        torch = self.torch
        t0 = time.perf_counter()
        self.size(n)
        torch.cuda.reset_peak_memory_stats()
        self.run(n, seed=0)
        row: dict[str, Any] = {"streams": n, "warmup_s": round(time.perf_counter() - t0, 2)}
        row["runs"] = [self.run(n, seed=1 + i) for i in range(runs)]
        row["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        return row


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if not args.device.startswith("cuda"):
        raise ChildError("cuda_only", f"{PEER} runs on CUDA only (its decode steps are CUDA graphs); got {args.device}")
    runner = BatchRunner(args)
    report: dict[str, Any] = {"peer": PEER, "versions": versions(), "model_type": runner.kind,
                              "speaker": runner.speaker, "load_s": round(runner.load_s, 2), "batches": []}  # fmt: skip
    for n in args.batch_sizes:
        try:
            report["batches"].append(runner.batch(n, args.runs))
        except Exception as e:  # reported, not raised: one batch size failing must not hide the others
            report["batches"].append({"streams": n, "error": f"{type(e).__name__}: {e}"})
    report["gpu"] = runner.torch.cuda.get_device_name()
    return report


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--speaker", default=None)
    parser.add_argument("--language", default="english")
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], required=True)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--output-json", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = Path(args.output_json)
    try:
        report, code = measure(args), 0
    except ChildError as e:
        report, code = {"error": {"code": e.code, "message": str(e)}}, 2
    out.write_text(json.dumps(report, indent=2) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
