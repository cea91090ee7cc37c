"""Many streams decoded together at fixed shapes: one step = one frame for every stream.

The decoder owns `slots` batch rows; a stream holds one row from its prefill to its end
(rows come from the scheduler). A step, for the first `b` rows (b a captured bucket size):
draw code 0 from the talker's last logits (each row with its own sampling settings, seed
and repetition history), run the code predictor for codes 1..15, feed the frame plus the
next text row to the talker (each row at its own position), and decode the frame to 1920
PCM samples with each row's incremental codec state. All of it is one CUDA graph per
(bucket, attention length) pair, captured at start-up; the host reads the codes and the PCM
once per step. Rows not in use still compute (on stale inputs) but never move or write
outside their own row.

A row can be *held* (`hold`): it stays in the batch but does not move. Everything a step keeps
(the talker's position, hidden state and logits, the repetition history, the codec's state
and position) is written for moving rows only, and a held row's draw is counter-based on the
frame it has not taken yet, so a stream's audio is the same however often it was held. The
runner holds streams far ahead of their listener (`runner.py`: the deadline rule).

Randomness is counter-based (a hash of seed, frame and column, see `hashed_uniform`), so a
stream's draws do not depend on the other streams in the batch, and nothing is drawn on
the host. Prefills run eagerly (variable length), one row at a time, between steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from voxgate.engines.qwen3 import gemv
from voxgate.engines.qwen3.codec import CodecDecoder, DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.fused_sampler import FRAME_ADD, FRAME_SET, RowSettings, TalkerScores, TextRows, sample_codes
from voxgate.engines.qwen3.prefill import PROMPTS, Prefiller, flat_rows
from voxgate.engines.qwen3.prompt import Prompt, PromptPlan, TextTable
from voxgate.engines.qwen3.sampling import batched_talker_scores, control_mask, hashed_gumbel, sample_rows
from voxgate.engines.qwen3.talker import Talker

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class GraphStats:
    """Counts of graph replays and of work that ran eagerly instead, by reason."""

    captured: bool = False
    graphs: int = 0
    capture_s: float = 0.0
    step_s: dict[int, float] = field(default_factory=dict)  # bucket -> a replayed step, seconds (`profile`)
    replays: int = 0
    eager_fallbacks: dict[str, int] = field(default_factory=dict)

    def fallback(self, reason: str) -> None:
        self.eager_fallbacks[reason] = self.eager_fallbacks.get(reason, 0) + 1


@dataclass(frozen=True)
class Admission:
    """A stream entering the batch: its row, prompt, sampling settings and seed, and the codec
    state to continue from (a cloned voice's reference pre-roll)."""

    row: int
    prompt: Prompt | PromptPlan  # a plan needs the decoder's text table
    params: SamplingParams
    seed: int
    context: DecoderState | None = None


@dataclass(frozen=True)
class StepResult:
    codes: np.ndarray  # (b, 16) int64: the frame each row drew (row's code 0 may be EOS)
    pcm: np.ndarray  # (b, samples_per_frame) float32: that frame decoded


def attention_lengths(capacity: int, smallest: int = 256) -> tuple[int, ...]:
    """The attention spans captured: 256, 512, ... up to the capacity."""
    lengths = [smallest]
    while lengths[-1] < capacity:
        lengths.append(min(capacity, lengths[-1] * 2))
    return tuple(lengths)


class BatchDecoder:
    def __init__(
        self,
        talker: Talker,
        codec: CodecDecoder,
        slots: int = 64,
        capacity: int = 2048,
        max_text_rows: int = 512,
        use_graphs: bool = True,
        compile_bodies: bool = False,
        sampling: SamplingParams | None = None,
        text_table: TextTable | None = None,
    ) -> None:
        if slots > BUCKETS[-1]:
            raise ValueError(f"at most {BUCKETS[-1]} streams decode together")
        # What the captured sampler must support, from the engine's settings: with top-k on,
        # only the top-k candidates are ranked (no full sort); top-p costs a softmax+cumsum.
        sampling = sampling or SamplingParams()
        ks = (sampling.top_k, sampling.subtalker_top_k)
        self.sample_width = max(ks) if min(ks) > 0 else 0
        self.nucleus = min(sampling.top_p, sampling.subtalker_top_p) < 1.0
        self.talker, self.codec, self.text_table = talker, codec, text_table
        self.slots, self.capacity, self.max_text_rows = slots, capacity, max_text_rows
        self.buckets = (*(b for b in BUCKETS if b < slots), slots)
        self.lengths = attention_lengths(capacity, min(256, capacity))
        cfg = talker.cfg
        weight = talker.codec_head.weight
        self.device, self.dtype = weight.device, weight.dtype
        s, h, v, groups = slots, cfg.stack.hidden_size, cfg.vocab_size, cfg.num_code_groups
        self.groups = groups
        self.eos_id = cfg.codec_eos_id
        z = {"device": self.device}
        self.cache = talker.new_cache(s, capacity)
        self.cp_cache = talker.new_predictor_cache(s)
        # Per-row decode state and sampling settings: each a row (contiguous, one value per slot)
        # of one table per dtype, so an admission sets every admitted row's integers, flags and
        # floats in three copies, not fifteen (the runner admits a burst while the event loop
        # wants the GIL, and every torch call gives it up and waits to get it back).
        self._ints = torch.zeros(8, s, dtype=torch.long, **z)
        self._flags = torch.zeros(2, s, dtype=torch.bool, **z)
        self._floats = torch.ones(5, s, **z)
        # position: the talker position the next step writes; draws: frames drawn so far; active:
        # 1 while the row's stream moves (not held, not free); the rest: see `_start_rows`.
        (self.position, self.draws, self.active, self.trailing_len, self.seeds, self.top_k, self.sub_top_k,
         self.min_new) = self._ints.unbind(0)  # fmt: skip
        self.do_sample, self.sub_do_sample = self._flags.unbind(0)
        temperature, sub_temperature, self.top_p, self.sub_top_p, penalty = self._floats.unbind(0)
        self.temperature, self.sub_temperature, self.penalty = (t.view(s, 1) for t in (temperature, sub_temperature,
                                                                                      penalty))  # fmt: skip
        self.hidden = torch.zeros(s, h, dtype=self.dtype, **z)
        self.logits = torch.zeros(s, v, dtype=torch.float32, **z)
        self.seen = torch.zeros(s, v, dtype=torch.bool, **z)  # codes drawn so far (repetition penalty)
        self.trailing = torch.zeros(s, max_text_rows, h, dtype=self.dtype, **z)
        self.pad = torch.zeros(h, dtype=self.dtype, **z)
        self.control = control_mask(v, cfg.predictor_vocab_size, cfg.codec_eos_id, self.device)
        self.eos = torch.zeros(v, dtype=torch.bool, **z)
        self.eos[cfg.codec_eos_id] = True
        # The codec decoder's per-row streaming state, and the step's outputs.
        self.codec_state = DecoderState()
        with torch.no_grad():  # normal tensors, not inference ones: torch.compile takes them as inputs
            codec.decode(torch.zeros(s, codec.config.num_quantizers, 1, dtype=torch.long, **z), self.codec_state)
        self.codec_state.freeze_rows(self.device, s)
        self.out_codes = torch.zeros(s, groups, dtype=torch.long, **z)
        self.out_pcm = torch.zeros(s, codec.config.samples_per_frame, dtype=self.dtype, **z)
        # On a GPU the codec decodes a frame on a second stream while the talker steps (both
        # are chains of small kernels that leave most of the GPU idle at small batches).
        self._codec_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # The fused sampler (with the Triton kernels, and top-k on): its embedding buffers.
        self.fused_sampler = talker.model.kernels and self.sample_width > 0
        if self.fused_sampler:
            self._first = torch.zeros(s, 2, h, dtype=self.dtype, **z)  # the code predictor's first input
            self._next = torch.zeros(s, h, dtype=self.dtype, **z)  # its input for the next code
            self._frame = torch.zeros(s, h, dtype=torch.float32, **z)  # the sum of the frame's embeddings
            self._talker_in = torch.zeros(s, h, dtype=self.dtype, **z)  # that plus the text: the talker's input
        # Host-side mirror of each row's position (to pick the attention length without a sync).
        self.host_position = [0] * s
        self.held: set[int] = set()  # rows kept still (`hold`)
        self.prefiller = Prefiller(talker, self.cache, self.hidden, self.logits, use_graphs)
        self._host: dict[tuple[bool, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.stats = GraphStats()
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._body: Callable[[int, int], None] = self._step_body
        if compile_bodies and self.device.type == "cuda":
            torch._dynamo.config.cache_size_limit = max(64, 2 * len(self.buckets) * len(self.lengths))
            self._body = torch.compile(self._step_body, dynamic=True)  # one compile for all bucket shapes
        if use_graphs and self.device.type == "cuda":
            self.capture()

    # ------------------------------------------------------------------ the fixed-shape step

    def _step_body(self, b: int, length: int) -> None:
        talker, cfg = self.talker, self.talker.cfg
        counters = self.draws[:b, None] * self.groups + torch.arange(self.groups, device=self.device)
        noise = hashed_gumbel(self.seeds[:b], counters, self.sample_width or cfg.vocab_size)  # (b, 16, W)
        if self.fused_sampler:
            codes, embeds = self.out_codes[:b], self._draw_fused(b, noise)
        else:
            codes, embeds = self._draw(b, noise)
        side = self._codec_stream
        if side is not None:  # the frame's decode needs only its codes: beside the talker step
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._decode(b, codes)
        hidden, logits = talker.step(embeds[:, None], self.cache.view(slice(0, b), length), self.position[:b])
        moving = self.active[:b, None] != 0  # a held row keeps the logits of the frame it has not drawn
        torch.where(moving, hidden, self.hidden[:b], out=self.hidden[:b])
        torch.where(moving, logits, self.logits[:b], out=self.logits[:b])
        self.position[:b] += self.active[:b]
        self.draws[:b] += self.active[:b]
        if side is None:
            self._decode(b, codes)
        else:
            torch.cuda.current_stream().wait_stream(side)

    def _decode(self, b: int, codes: torch.Tensor) -> None:
        audio = codes.clamp(max=self.codec.config.codebook_size - 1)[:, :, None]  # EOS rows decode a stand-in
        self.out_pcm[:b].copy_(self.codec.run(audio, self.codec_state.rows(b, self.active[:b] != 0)))

    def _draw(self, b: int, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame's 16 codes for every row (into `out_codes`) and the talker's next input
        (B, H): the sum of their embeddings plus the row's next text embedding."""
        talker, logits = self.talker, self._drawn_from(b, 0, self.logits[:b])
        scores = batched_talker_scores(
            logits, self.seen[:b], self.penalty[:b], self.draws[:b] < self.min_new[:b], self.eos, self.control
        )
        code0 = self._sample(scores, noise[:, 0], b, predictor=False)
        marked = self.seen[:b].gather(1, code0[:, None]) | (self.active[:b, None] != 0)  # held rows: unchanged
        self.seen[:b].scatter_(1, code0[:, None], marked)
        codes = self._predict_rest(b, code0, noise)
        self.out_codes[:b].copy_(codes)
        rows = torch.arange(b, device=self.device)
        text = self.trailing[rows, self.draws[:b].clamp(max=self.max_text_rows - 1)]
        text = torch.where((self.draws[:b] < self.trailing_len[:b])[:, None], text, self.pad)
        return codes, talker.frame_embedding(codes) + text

    def _draw_fused(self, b: int, noise: torch.Tensor) -> torch.Tensor:
        """`_draw` with one fused kernel per code (`fused_sampler.py`): each draws, writes the
        code, and gathers its embedding as the next input and into the frame's sum."""
        talker, cp, width, nucleus = self.talker, self.talker.code_predictor, self.sample_width, self.nucleus
        codes, first, frame = self.out_codes[:b], self._first[:b], self._frame[:b]
        main = RowSettings(self.do_sample[:b], self.temperature[:b], self.top_k[:b], self.top_p[:b])
        sub = RowSettings(self.sub_do_sample[:b], self.sub_temperature[:b], self.sub_top_k[:b], self.sub_top_p[:b])
        scores = TalkerScores(self.seen[:b], self.penalty[:b], self.draws[:b], self.min_new[:b], self.control,
                              self.eos_id, self.active[:b])  # fmt: skip
        table = talker.model.codec_embedding.weight
        sample_codes(self._drawn_from(b, 0, self.logits[:b]), noise[:, 0], main, width, nucleus, codes[:, 0], table,
                     first[:, 1], frame, FRAME_SET, talker=scores)  # fmt: skip
        first[:, 0].copy_(self.hidden[:b])
        text = TextRows(self.trailing[:b], self.trailing_len[:b], self.draws[:b], self.pad, self._talker_in[:b])
        project, cache = cp.small_to_mtp_projection, self.cp_cache.view(slice(0, b))
        inputs, position, last = project(first), 0, self.groups - 2
        for j in range(self.groups - 1):
            out = cp.model(inputs, cache, position)[:, -1]
            position += inputs.shape[1]
            table = cp.model.codec_embedding[j].weight
            following = self._next[:b] if j < last else None
            logits = self._drawn_from(b, j + 1, gemv.linear(out, cp.lm_head[j].weight))
            sample_codes(logits, noise[:, j + 1], sub, width, nucleus, codes[:, j + 1], table, following, frame,
                         FRAME_ADD, text=text if j == last else None)  # fmt: skip
            if following is not None:
                inputs = project(following)[:, None]
        return text.out

    def _drawn_from(self, b: int, column: int, logits: torch.Tensor) -> torch.Tensor:
        """The logits (b, V) that code `column` (0: the talker's, 1..15: the code predictor's) is
        drawn from, before any processor or sampler: the model's own, unchanged (no operation,
        so the captured graphs are the same with or without the hook). The one seam for teacher
        forcing (`voxgate/bench/parity_runs.py` keeps them and substitutes the teacher's code)."""
        return logits

    def _sample(self, logits: torch.Tensor, gumbel: torch.Tensor, b: int, predictor: bool) -> torch.Tensor:
        """One id per row with each row's talker (or code-predictor) settings."""
        if predictor:
            settings = (self.sub_do_sample, self.sub_temperature, self.sub_top_k, self.sub_top_p)
        else:
            settings = (self.do_sample, self.temperature, self.top_k, self.top_p)
        rows = (s[:b] for s in settings)
        return sample_rows(logits, gumbel, *rows, self.sample_width, self.nucleus)

    def _predict_rest(self, b: int, code0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Codes 1..15 for every row: 15 sub-steps of the code predictor, sampled per row."""
        talker = self.talker
        cp = talker.code_predictor
        project = cp.small_to_mtp_projection
        cache = self.cp_cache.view(slice(0, b))
        inputs = project(torch.stack([self.hidden[:b], talker.codec(code0)], dim=1))
        codes, position = [code0], 0
        for j in range(self.groups - 1):
            out = cp.model(inputs, cache, position)[:, -1]
            position += inputs.shape[1]
            logits = self._drawn_from(b, j + 1, cp.lm_head[j](out).float())
            code = self._sample(logits, noise[:, j + 1], b, predictor=True)
            codes.append(code)
            if j < self.groups - 2:
                inputs = project(cp.model.codec_embedding[j](code))[:, None]
        return torch.stack(codes, dim=1)

    # ------------------------------------------------------------------ graphs

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up on a side stream, then capture one graph per (bucket, length) (start-up only)."""
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for b in self.buckets:
                for length in self.lengths:
                    for _ in range(2):
                        self._body(b, length)
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        for b in self.buckets:
            for length in self.lengths:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._body(b, length)
                self._graphs[b, length] = graph
        self.prefiller.capture(pool)
        torch.cuda.synchronize()
        self.stats.step_s = self.profile()
        self.codec_state.reset()  # warm-up and capture ran on the idle rows' buffers
        self.stats.captured, self.stats.graphs = True, len(self._graphs) + len(self.prefiller.graphs)
        self.stats.capture_s = time.perf_counter() - t0
        log.info(
            "captured %d CUDA graphs (buckets %s x attention lengths %s, and prefills) in %.1f s",
            self.stats.graphs, self.buckets, self.lengths, self.stats.capture_s,
        )  # fmt: skip

    def profile(self, repeats: int = 3) -> dict[int, float]:
        """Each bucket's captured step, replayed with its outputs copied to the host: the median
        of `repeats` (after one warm replay), in seconds. At the second attention span (512
        positions: a prompt and about 30 s of speech), what most streams attend over; longer
        streams' steps are measured live by the runner. Start-up only: the rows are idle."""
        length = self.lengths[min(1, len(self.lengths) - 1)]
        costs: dict[int, float] = {}
        for b in self.buckets:
            graph, took = self._graphs[b, length], []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                graph.replay()
                PendingStep.start(self.out_codes[:b], self.out_pcm[:b], self._host_buffers(b)).result()
                took.append(time.perf_counter() - t0)
            costs[b] = sorted(took[1:])[len(took[1:]) // 2]
        log.info("step cost by bucket (ms): %s", ", ".join(f"{b}: {c * 1e3:.1f}" for b, c in costs.items()))
        return costs

    # ------------------------------------------------------------------ rows

    def admit(
        self, row: int, prompt: Prompt, params: SamplingParams, seed: int, context: DecoderState | None = None
    ) -> None:
        """Prefill one prompt into `row`; see `admit_many`."""
        self.admit_many([Admission(row, prompt, params, seed, context)])

    @torch.inference_mode()
    def admit_many(self, admissions: list[Admission]) -> None:
        """Prefill the prompts (see `prefill.py`: batched, padded, graphs for the usual sizes)
        and start each stream in its row."""
        for a in admissions:
            self._check(a.params)
        lengths = [a.prompt.length for a in admissions]
        longest = max(lengths)
        if longest + 2 > self.capacity:
            raise ValueError(f"a prompt of {longest} positions does not fit a KV cache of {self.capacity}")
        planned = [isinstance(a.prompt, PromptPlan) for a in admissions]  # embedded here, on this stream
        admissions = self._embedded(admissions)
        for a, here in zip(admissions, planned, strict=True):
            if self.device.type == "cuda" and not here:  # built on another stream: keep its memory until read
                for t in (a.prompt.embeds, a.prompt.trailing, a.prompt.pad):
                    t.record_stream(torch.cuda.current_stream())
        rows = self._device_tensor([a.row for a in admissions], torch.long)
        for start in range(0, len(admissions), PROMPTS[-1]):
            chunk = admissions[start : start + PROMPTS[-1]]
            self.prefiller.run(
                [a.prompt.embeds for a in chunk], [a.row for a in chunk], rows[start : start + len(chunk)],
                self._device_tensor,
            )  # fmt: skip
        self._start_rows(admissions, lengths, rows)

    def _embedded(self, admissions: list[Admission]) -> list[Admission]:
        """The admissions with every plan made a `Prompt`, all plans in one go (`TextTable.prompts`)."""
        plans = [a.prompt for a in admissions if isinstance(a.prompt, PromptPlan)]
        if not plans:
            return admissions
        if self.text_table is None:
            raise ValueError("a prompt plan needs a decoder with a text table")
        made = iter(self.text_table.prompts(plans))
        return [replace(a, prompt=next(made)) if isinstance(a.prompt, PromptPlan) else a for a in admissions]

    def _device_tensor(
        self, values: list[int] | list[list[int]] | list[list[bool]] | list[list[float]], dtype: torch.dtype
    ) -> torch.Tensor:
        """Host values on the device without waiting for queued GPU work (pinned, async copy)."""
        host = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _check(self, params: SamplingParams) -> None:
        """A stream's settings must fit what the sampler was captured for."""
        for k in (params.top_k, params.subtalker_top_k):
            if self.sample_width and not 0 < k <= self.sample_width:
                raise ValueError(f"top_k {k} is outside the captured sampler's 1..{self.sample_width}")
        if not self.nucleus and min(params.top_p, params.subtalker_top_p) < 1.0:
            raise ValueError("top_p < 1 needs a sampler captured with top-p")

    def _start_rows(self, admissions: list[Admission], lengths: list[int], rows: torch.Tensor) -> None:
        """Each admitted row's position, text rows, seed and sampling settings, and a fresh (or
        the voice's pre-roll) codec state."""
        ints, flags, floats = [], [], []  # per admitted row, in the order of the tables' rows (`__init__`)
        for a, length in zip(admissions, lengths, strict=True):
            p, text_rows = a.params, min(a.prompt.trailing_rows, self.max_text_rows)
            ints.append([length, 0, 1, text_rows, a.seed & 0x7FFFFFFF, p.top_k, p.subtalker_top_k, p.min_new_tokens])
            flags.append([p.do_sample, p.subtalker_do_sample])
            floats.append([p.temperature, p.subtalker_temperature, p.top_p, p.subtalker_top_p, p.repetition_penalty])
            self.host_position[a.row] = length
        for table, values in ((self._ints, ints), (self._flags, flags), (self._floats, floats)):
            table.index_copy_(1, rows, self._device_tensor(values, table.dtype).T)
        self.seen.index_fill_(0, rows, False)
        self.held.difference_update(a.row for a in admissions)
        self.pad.copy_(admissions[0].prompt.pad[0])
        # Every row's text rows in one copy: (row r, text row t) is r * max_text_rows + t of the
        # flattened buffer (a burst of admissions is host work done while holding the GIL).
        texts = [a.prompt.trailing[0, : self.max_text_rows] for a in admissions]
        places = flat_rows([a.row * self.max_text_rows for a in admissions], [t.shape[0] for t in texts])
        if places:
            flat = self.trailing.view(-1, self.trailing.shape[2])
            flat.index_copy_(0, self._device_tensor(places, torch.long), torch.cat(texts).to(flat.dtype))
        self.codec_state.start_rows(rows, [(a.row, a.context) for a in admissions if a.context is not None])

    def release(self, row: int) -> None:
        """The row's stream ended: it stops moving (its slot is free for the next admit)."""
        self.held.discard(row)
        self.active[row] = 0

    def hold(self, row: int, held: bool) -> None:
        """Keep a running row still in the steps from now on (`held`), or let it move again.
        A held row inside a step's bucket computes on its unchanged state and keeps none of
        it; its outputs in that step mean nothing (the caller does not hand them out)."""
        if held == (row in self.held):
            return
        if held:
            self.held.add(row)
        else:
            self.held.discard(row)
        self.active[row] = 0 if held else 1

    def frame_room(self, prompt_length: int) -> int:
        """How many frames a prompt of this length can draw before its row's cache is full
        (one position spare: a pipelined runner may step a row once after its last frame)."""
        return self.capacity - prompt_length - 2

    def step(self, b: int, rows: list[int]) -> StepResult:
        """One frame for the moving rows among 0..b-1 (`rows`: those, to size the attention span)."""
        return self.launch(b, rows).result()

    @torch.inference_mode()
    def launch(self, b: int, rows: list[int]) -> PendingStep:
        """Start a step and the copy of its outputs to the host, without waiting: the caller
        can deliver the previous step's frames while the GPU works on this one."""
        needed = max((self.host_position[r] + 1 for r in rows), default=1)
        length = next(n for n in self.lengths if n >= needed)
        graph = self._graphs.get((b, length))
        if graph is not None:
            graph.replay()
            self.stats.replays += 1
        else:
            if self.stats.captured:
                self.stats.fallback("uncaptured_shape")
            self._body(b, length)
        for r in rows:
            self.host_position[r] += 1
        return PendingStep.start(self.out_codes[:b], self.out_pcm[:b], self._host_buffers(b))

    def _host_buffers(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Alternating (pinned, on a GPU) host buffers, so two steps can be in flight."""
        self._flip = not getattr(self, "_flip", False)
        key = (self._flip, b)
        buffers = self._host.get(key)
        if buffers is None:
            pinned = self.device.type == "cuda"
            codes = torch.empty(b, self.groups, dtype=torch.long, pin_memory=pinned)
            pcm = torch.empty(b, self.out_pcm.shape[1], dtype=self.dtype, pin_memory=pinned)
            buffers = self._host[key] = (codes, pcm)
        return buffers


@dataclass
class PendingStep:
    """A launched step: its outputs are being copied to host buffers; `result()` waits."""

    codes: torch.Tensor
    pcm: torch.Tensor
    done: torch.cuda.Event | None

    @classmethod
    def start(cls, codes: torch.Tensor, pcm: torch.Tensor, host: tuple[torch.Tensor, torch.Tensor]) -> PendingStep:
        host_codes, host_pcm = host
        host_codes.copy_(codes, non_blocking=True)
        host_pcm.copy_(pcm, non_blocking=True)
        done = None
        if codes.is_cuda:
            done = torch.cuda.Event()
            done.record()
        return cls(host_codes, host_pcm, done)

    def gpu_finished(self) -> bool:
        """Whether the GPU is done with it, without waiting (False on the CPU: no GPU)."""
        return self.done is not None and self.done.query()

    def result(self) -> StepResult:
        if self.done is not None:
            self.done.synchronize()  # the one wait per step
        return StepResult(self.codes.numpy().copy(), self.pcm.to(torch.float32, copy=True).numpy())
