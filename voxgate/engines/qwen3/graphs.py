"""Fixed-shape decoding, captured as CUDA graphs: one graph for the talker's decode step,
one for a whole code-predictor frame (all 15 sub-steps and their sampling), and one for the
codec decoder's packet step.

One stream at a time (batch 1; batching is the next step). Everything a graph reads or
writes lives in static buffers owned here; a replay is "copy inputs in, replay, read the
static outputs". Randomness comes in as uniform noise drawn per frame from the request's
generator and is turned into Gumbel-max draws inside the graph, so sampling needs no host
sync; the only sync per frame is reading code 0 to stop at EOS. On the CPU, or when capture
is off, the same fixed-shape code runs eagerly (that is how it is tested).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from voxgate.engines.qwen3.codec import CodecDecoder, DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.prompt import Prompt
from voxgate.engines.qwen3.sampling import control_mask, talker_scores
from voxgate.engines.qwen3.talker import Talker
from voxgate.types import CancelToken

log = logging.getLogger(__name__)


def gumbel_pick(logits: torch.Tensor, noise: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """A draw from softmax(top-k(logits) / temperature) by Gumbel-max: argmax(l/T - log(-log u))."""
    scores = logits / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    gumbel = -torch.log(-torch.log(noise.clamp(1e-10, 1.0 - 1e-7)))
    return torch.argmax(scores + gumbel, dim=-1)


@dataclass
class GraphStats:
    """Counts of graph replays and of work that ran eagerly instead, by reason."""

    captured: bool = False
    replays: int = 0
    eager_fallbacks: dict[str, int] = field(default_factory=dict)

    def fallback(self, reason: str) -> None:
        self.eager_fallbacks[reason] = self.eager_fallbacks.get(reason, 0) + 1


class StaticDecoder:
    """The talker's KV cache, its decode step and the code predictor frame at fixed shapes."""

    def __init__(
        self,
        talker: Talker,
        params: SamplingParams,
        capacity: int = 4096,
        use_graphs: bool = True,
        compile_bodies: bool = False,
    ) -> None:
        self.talker, self.params, self.capacity = talker, params, capacity
        p = talker.codec_head.weight
        self.device, self.dtype = p.device, p.dtype
        cfg = talker.cfg
        self.cache = talker.new_cache(1, capacity)
        self.cp_cache = talker.new_predictor_cache(1)
        h, v = cfg.stack.hidden_size, cfg.predictor_vocab_size
        z = dict(device=self.device)
        self.in_embeds = torch.zeros(1, 1, h, dtype=self.dtype, **z)
        self.in_position = torch.zeros((), dtype=torch.long, **z)
        self.out_hidden = torch.zeros(1, h, dtype=self.dtype, **z)
        self.out_logits = torch.zeros(1, cfg.vocab_size, dtype=torch.float32, **z)
        self.cp_hidden = torch.zeros(1, h, dtype=self.dtype, **z)
        self.cp_code0 = torch.zeros(1, dtype=torch.long, **z)
        self.cp_noise = torch.rand(cfg.num_code_groups - 1, v, **z)
        self.cp_codes = torch.zeros(1, cfg.num_code_groups, dtype=torch.long, **z)
        self.cp_embeds = torch.zeros(1, h, dtype=self.dtype, **z)
        self.stats = GraphStats()
        self._step_graph: torch.cuda.CUDAGraph | None = None
        self._cp_graph: torch.cuda.CUDAGraph | None = None
        self._step_fn: Callable[[], None] = self._step_body
        self._cp_fn: Callable[[], None] = self._cp_body
        if compile_bodies and self.device.type == "cuda":  # fuse the small kernels before capturing
            self._step_fn = torch.compile(self._step_body, dynamic=False)
            self._cp_fn = torch.compile(self._cp_body, dynamic=False)
        if use_graphs and self.device.type == "cuda":
            self.capture()

    # -------------------------------------------------------------- the two fixed-shape bodies

    def _step_body(self) -> None:
        hidden, logits = self.talker.step(self.in_embeds, self.cache, self.in_position)
        self.out_hidden.copy_(hidden)
        self.out_logits.copy_(logits)

    def _cp_body(self) -> None:
        talker, p = self.talker, self.params
        cp = talker.code_predictor
        project = cp.small_to_mtp_projection
        inputs = project(torch.stack([self.cp_hidden, talker.codec(self.cp_code0)], dim=1))
        codes, position = [self.cp_code0], 0
        for j in range(talker.cfg.num_code_groups - 1):
            out = cp.model(inputs, self.cp_cache, position)[:, -1]
            position += inputs.shape[1]
            logits = cp.lm_head[j](out).float()
            if p.subtalker_do_sample:
                code = gumbel_pick(logits, self.cp_noise[j : j + 1], p.subtalker_temperature, p.subtalker_top_k)
            else:
                code = logits.argmax(dim=-1)
            codes.append(code)
            if j < talker.cfg.num_code_groups - 2:
                inputs = project(cp.model.codec_embedding[j](code))[:, None]
        frame = torch.stack(codes, dim=1)
        self.cp_codes.copy_(frame)
        self.cp_embeds.copy_(talker.frame_embedding(frame))

    # -------------------------------------------------------------- graph lifecycle

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up on a side stream, then capture both bodies (at start-up, never per request)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._step_fn()
                self._cp_fn()
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        self._step_graph, self._cp_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._step_graph, pool=pool):
            self._step_fn()
        with torch.cuda.graph(self._cp_graph, pool=pool):
            self._cp_fn()
        torch.cuda.synchronize()
        self.stats.captured = True
        log.info("captured CUDA graphs: talker step and code-predictor frame (capacity %d)", self.capacity)

    def _run(self, graph: torch.cuda.CUDAGraph | None, body: Callable[[], None]) -> None:
        if graph is not None:
            graph.replay()
            self.stats.replays += 1
        else:
            body()

    # -------------------------------------------------------------- generation

    @torch.inference_mode()
    def generate(
        self,
        prompt: Prompt,
        cancel: CancelToken | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> Iterator[torch.Tensor]:
        """Frames of codes (16,) like `generate_codes`, through the fixed-shape path."""
        cfg, p = self.talker.cfg, self.params
        limit = min(max_new_tokens or p.max_new_tokens, self.capacity - prompt.embeds.shape[1] - 1)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else secrets.randbits(62))  # never reseed torch globally
        control = control_mask(cfg.vocab_size, cfg.predictor_vocab_size, cfg.codec_eos_id, self.device)
        hidden, logits = self.talker.step(prompt.embeds, self.cache, 0)  # prefill: eager, variable length
        position = prompt.embeds.shape[1]
        history = torch.zeros(1, 0, dtype=torch.long, device=self.device)
        for draw in range(limit):
            if cancel is not None and cancel.cancelled:
                return
            scores = talker_scores(
                logits, history, draw, p.repetition_penalty, p.min_new_tokens, cfg.codec_eos_id, control
            )
            if p.do_sample:
                noise = torch.rand(1, cfg.vocab_size, device=self.device, generator=generator)
                code0 = gumbel_pick(scores, noise, p.temperature, p.top_k)
            else:
                code0 = scores.argmax(dim=-1)
            if int(code0) == cfg.codec_eos_id or draw == limit - 1:  # the one host sync per frame
                return
            history = torch.cat([history, code0[:, None]], dim=1)
            self.cp_hidden.copy_(hidden)
            self.cp_code0.copy_(code0)
            if p.subtalker_do_sample:
                self.cp_noise.copy_(torch.rand(self.cp_noise.shape, device=self.device, generator=generator))
            self._run(self._cp_graph, self._cp_body)
            yield self.cp_codes[0].clone()
            row = prompt.trailing[:, draw] if draw < prompt.trailing.shape[1] else prompt.pad
            self.in_embeds.copy_((self.cp_embeds + row)[:, None])
            self.in_position.fill_(position)
            self._run(self._step_graph, self._step_body)
            hidden, logits = self.out_hidden, self.out_logits
            position += 1


class StaticCodecStep:
    """The codec decoder for packets of `packet` frames with its state in fixed buffers,
    captured as one CUDA graph (a shorter last packet runs eagerly on the same state)."""

    def __init__(self, codec: CodecDecoder, packet: int, use_graphs: bool = True) -> None:
        self.codec, self.packet = codec, packet
        weight = codec.pre_conv.conv.weight
        self.codes = torch.zeros(1, codec.config.num_quantizers, packet, dtype=torch.long, device=weight.device)
        self.state = DecoderState()
        with torch.inference_mode():
            codec.decode(self.codes, self.state)  # makes every state buffer once
        self.state.freeze(weight.device)
        self.out = torch.zeros(1, packet * codec.config.samples_per_frame, dtype=weight.dtype, device=weight.device)
        self.frames = 0
        self.stats = GraphStats()
        self._graph: torch.cuda.CUDAGraph | None = None
        if use_graphs and weight.device.type == "cuda":
            self._capture()

    def _body(self) -> None:
        self.out.copy_(self.codec.decode(self.codes, self.state))

    @torch.inference_mode()
    def _capture(self) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._body()
        torch.cuda.current_stream().wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._body()
        torch.cuda.synchronize()
        self.reset()
        self.stats.captured = True
        log.info("captured the codec decoder step for %d-frame packets", self.packet)

    def reset(self, context: DecoderState | None = None) -> None:
        """Start a new stream, optionally continuing from `context` (a voice's reference pre-roll)."""
        self.state.reset()
        self.frames = 0
        if context is not None:
            self.state.load(context)
            self.frames = context.position

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (1, 16, n <= packet) -> PCM (1, n * 1920), continuing the stream."""
        n = codes.shape[-1]
        if self.frames + n > self.codec.config.max_position_embeddings:
            raise ValueError(f"the codec decodes at most {self.codec.config.max_position_embeddings} frames per stream")
        self.frames += n
        if n == self.packet:
            self.codes.copy_(codes)
            if self._graph is not None:
                self._graph.replay()
                self.stats.replays += 1
            else:
                self._body()
            return self.out.clone()
        self.stats.fallback("short_last_packet")
        return self.codec.decode(codes, self.state)
