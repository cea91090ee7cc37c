"""The three teacher-forced runs behind `voxgate bench parity`: the official implementation
(fp32 to make the teacher codes and the reference logits, bf16 as the yardstick) and
voxgate's production decoder, each fed the same codes frame after frame.

Forcing works the same way on both sides: the logits a model computed are kept, then
replaced by logits that make the model's own sampler pick the teacher's code, so the
sampler, the embedding gathers and the caches all run as in production and no error
carries over from one frame to the next.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxgate.bench.import_stubs import UNUSED_BY_12HZ, stub_missing
from voxgate.engines.qwen3.batch import Admission, BatchDecoder
from voxgate.engines.qwen3.loader import Qwen3Checkpoint
from voxgate.engines.qwen3.prompt import PromptBuilder

FORCE = 1e4  # a forced code's logit (others get -FORCE): beyond any temperature, penalty or Gumbel noise


@dataclass(frozen=True, slots=True)
class Case:
    """One prompt: its text and how the voice is chosen (speaker, instruction or clone)."""

    name: str
    text: str
    language: str = "Auto"
    speaker: str | None = None
    instruct: str | None = None
    stream_text: bool = False
    clone: str | None = None  # "xvector" or "icl" (Base checkpoints)
    ref_text: str | None = None


@dataclass(slots=True)
class Trace:
    """What one run computed per frame: code-0 logits (F, V), code-predictor logits
    (F, 15, V'), and the frames' PCM (streamed or decoded at once), all float32 on the CPU."""

    code0: torch.Tensor
    rest: torch.Tensor
    pcm: np.ndarray


def load_official(model_dir: Path, device: str, dtype: torch.dtype, attention: str = "eager") -> Any:
    """The official `Qwen3TTSModel` on the checkpoint, offline."""
    stub_missing(UNUSED_BY_12HZ)  # the device machine's bundle leaves them out (bench/gpu_bundle_parity.sh)
    import qwen_tts

    return qwen_tts.Qwen3TTSModel.from_pretrained(
        str(model_dir), dtype=dtype, attn_implementation=attention, device_map=device, local_files_only=True
    )


# ---------------------------------------------------------------------------------- official


class _Forcing:
    """Forward hooks on the official talker and code predictor. Each call's last-position
    logits are kept; with a teacher they are replaced by the teacher's code, without one
    only EOS is blocked (the teacher run lasts its frames)."""

    def __init__(self, teacher: torch.Tensor | None, eos: int, groups: int) -> None:
        self.teacher, self.eos, self.groups = teacher, eos, groups
        self.code0: list[torch.Tensor] = []
        self.rest: list[torch.Tensor] = []

    def talker(self, _module: Any, _args: Any, output: Any) -> Any:
        logits = output.logits[:, -1:].float()
        frame = len(self.code0)
        self.code0.append(logits[0, 0].cpu().clone())
        if self.teacher is None:
            output.logits = logits.index_fill(-1, torch.tensor([self.eos], device=logits.device), -torch.inf)
        else:
            output.logits = _one_hot(logits, int(self.teacher[min(frame, len(self.teacher) - 1), 0]))
        return output

    def predictor(self, _module: Any, _args: Any, output: Any) -> Any:
        logits = output.logits[:, -1:].float()
        frame, column = divmod(len(self.rest), self.groups - 1)
        self.rest.append(logits[0, 0].cpu().clone())
        if self.teacher is not None:
            output.logits = _one_hot(logits, int(self.teacher[frame, column + 1]))
        return output


def _one_hot(like: torch.Tensor, code: int) -> torch.Tensor:
    forced = torch.full_like(like, -FORCE)
    forced[..., code] = FORCE
    return forced


def _template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def _official_inputs(tts: Any, case: Case, voice: dict[str, torch.Tensor]) -> dict[str, Any]:
    """`generate` arguments for a case, as the official `Qwen3TTSModel` builds them."""
    ids = tts.processor(text=_template(case.text), return_tensors="pt")["input_ids"].to(tts.model.device)
    inputs: dict[str, Any] = {
        "input_ids": [ids],
        "languages": [case.language],
        "non_streaming_mode": not case.stream_text,
    }
    if case.clone is None:
        instruct = None
        if case.instruct:
            text = f"<|im_start|>user\n{case.instruct}<|im_end|>\n"
            instruct = tts.processor(text=text, return_tensors="pt")["input_ids"].to(tts.model.device)
        return inputs | {"instruct_ids": [instruct], "speakers": [case.speaker]}
    icl = case.clone == "icl"
    inputs["voice_clone_prompt"] = {"ref_code": [voice["ref_codes"] if icl else None],
                                    "ref_spk_embedding": [voice["xvector"]], "x_vector_only_mode": [not icl],
                                    "icl_mode": [icl]}  # fmt: skip
    if icl:
        ref = f"<|im_start|>assistant\n{case.ref_text}<|im_end|>\n"
        inputs["ref_ids"] = [tts.processor(text=ref, return_tensors="pt")["input_ids"].to(tts.model.device)]
    return inputs


@torch.inference_mode()
def run_official(
    tts: Any, case: Case, voice: dict[str, torch.Tensor], frames: int, teacher: torch.Tensor | None, seed: int
) -> tuple[torch.Tensor, Trace]:
    """`frames` frames of the official model: drawn by its own sampler (seeded; the teacher
    run) or forced to `teacher` (F, 16); its codes, logits and one-shot decode."""
    talker = tts.model.talker
    cfg = tts.model.config.talker_config
    forcing = _Forcing(teacher, cfg.codec_eos_token_id, cfg.num_code_groups)
    hooks = [talker.register_forward_hook(forcing.talker),
             talker.code_predictor.register_forward_hook(forcing.predictor)]  # fmt: skip
    torch.manual_seed(seed)
    sampled = teacher is None  # forced logits leave one candidate, so greedy is enough
    try:
        codes, _ = tts.model.generate(
            **_official_inputs(tts, case, voice), max_new_tokens=frames + 1, do_sample=sampled,
            subtalker_dosample=sampled, repetition_penalty=1.05,
        )  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    codes = codes[0].cpu()
    if codes.shape[0] != frames or (teacher is not None and not torch.equal(codes, teacher)):
        raise RuntimeError(f"official run of {case.name}: {codes.shape[0]} frames, forced codes not kept")
    rest = torch.stack(forcing.rest).reshape(frames, cfg.num_code_groups - 1, -1)
    decoder = tts.model.speech_tokenizer.model.decoder
    pcm = decoder(codes.T[None].to(tts.model.device))[0, 0].float().cpu().numpy()
    return codes, Trace(torch.stack(forcing.code0[:frames]), rest, pcm)


# ---------------------------------------------------------------------------------- voxgate


class ForcedDecoder(BatchDecoder):
    """The production batched decoder (same graphs, kernels, sampler and caches), whose rows
    draw the codes put in `forced` (S, 16) and keep the logits they computed on the way in
    `kept0` (S, V) and `kept_rest` (S, 15, V'): it overrides only `BatchDecoder._drawn_from`,
    the seam between the model's logits and the sampler."""

    def __init__(self, talker: Any, codec: Any, **kwargs: Any) -> None:
        cfg, device = talker.cfg, talker.codec_head.weight.device
        slots = kwargs.get("slots", 64)  # the buffers exist before the parent captures its graphs
        self.forced = torch.zeros(slots, cfg.num_code_groups, dtype=torch.long, device=device)
        self.kept0 = torch.zeros(slots, cfg.vocab_size, device=device)
        self.kept_rest = torch.zeros(slots, cfg.num_code_groups - 1, cfg.predictor_vocab_size, device=device)
        super().__init__(talker, codec, **kwargs)

    def _drawn_from(self, b: int, column: int, logits: torch.Tensor) -> torch.Tensor:
        """Keep the model's logits for code `column`, then hand the sampler ones that make it
        draw the forced code (the talker's processors and the sampler still run on them)."""
        kept = self.kept0[:b] if column == 0 else self.kept_rest[:b, column - 1]
        kept.copy_(logits)
        ids = torch.arange(logits.shape[-1], device=logits.device)
        hit = ids == self.forced[:b, column, None]
        return torch.where(hit, FORCE, -FORCE).to(logits.dtype)


def build_prompt(ck: Qwen3Checkpoint, case: Case, voice: dict[str, torch.Tensor]) -> Any:
    """voxgate's prompt for a case (the builder the engine uses)."""
    builder = PromptBuilder(ck.config, ck.tokenizer, ck.talker)
    if case.clone is None:
        return builder.build(case.text, speaker=case.speaker, language=case.language, instruct=case.instruct,
                             stream_text=case.stream_text)  # fmt: skip
    device, dtype = ck.talker.codec_head.weight.device, ck.talker.codec_head.weight.dtype
    icl = case.clone == "icl"
    return builder.build(
        case.text, speaker_embedding=voice["xvector"].to(device, dtype), language=case.language,
        ref_codes=voice["ref_codes"].to(device) if icl else None, ref_text=case.ref_text if icl else None,
        stream_text=case.stream_text,
    )  # fmt: skip


def run_voxgate(
    decoder: ForcedDecoder, ck: Qwen3Checkpoint, streams: list[tuple[Case, torch.Tensor]],
    voice: dict[str, torch.Tensor], watch: int = 0,
) -> Trace:  # fmt: skip
    """All `streams` (case, teacher codes) in rows 0..n-1 of one bucket, stepped together and
    forced to their teachers; the trace of row `watch` (its PCM as streamed, frame by frame)."""
    from voxgate.engines.qwen3.config import SamplingParams

    params = replace(SamplingParams.from_generation_config(ck.generation), min_new_tokens=0)
    frames = min(len(t) for _, t in streams)
    rows = list(range(len(streams)))
    decoder.admit_many(
        [Admission(r, build_prompt(ck, case, voice), params, seed=r) for r, (case, _) in enumerate(streams)]
    )
    teachers = torch.stack([t[:frames] for _, t in streams], dim=1)  # (F, n, 16)
    b = next(size for size in decoder.buckets if size >= len(streams))
    code0, rest, pcm = [], [], []
    try:
        for t in range(frames):
            decoder.forced[: len(streams)].copy_(teachers[t])
            result = decoder.step(b, rows)
            if not np.array_equal(result.codes[: len(streams)], teachers[t].numpy()):
                raise RuntimeError(f"frame {t}: the decoder did not draw the forced codes")
            code0.append(decoder.kept0[watch].float().cpu().clone())
            rest.append(decoder.kept_rest[watch].float().cpu().clone())
            pcm.append(result.pcm[watch])
    finally:
        for r in rows:
            decoder.release(r)
    return Trace(torch.stack(code0), torch.stack(rest), np.concatenate(pcm))
