"""Prompts into batch rows: one talker forward over several padded prompts, their keys and
values copied into their rows of the batch cache, each row's last hidden state and logits.

Small batches of short prompts (up to 16 prompts of up to 256 positions, the usual case)
run at fixed shapes, through buffers filled with a few operations whatever the number of
prompts (a burst of 64 admissions is host work the runner does while holding the GIL): as
CUDA graphs captured at start-up per (prompts, length) bucket on a GPU, so admitting a stream
costs a couple of milliseconds instead of a few hundred eager kernel launches, and eagerly
through the same buffers elsewhere (so the CPU tests run the path the GPU replays). Anything
bigger runs the same forward eagerly at its own shape. Padding is harmless: a row's positions
past its own prompt are written again by its decode steps before any query can see them, and a
batch padded to its bucket repeats its last prompt (same row, same values).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from voxgate.engines.qwen3.layers import KVCache
from voxgate.engines.qwen3.talker import Talker


def flat_rows(firsts: list[int], counts: list[int]) -> list[int]:
    """Rows of a flattened (n, width, H) buffer for `counts[i]` consecutive positions starting at
    flat row `firsts[i]` (row i * width, say): one index for one `index_copy_` of many pieces."""
    if not counts:
        return []
    return np.concatenate([first + np.arange(count) for first, count in zip(firsts, counts, strict=True)]).tolist()


PROMPTS = (1, 2, 4, 8, 16)
LENGTHS = (32, 64, 128, 256)


class Prefiller:
    def __init__(
        self, talker: Talker, cache: KVCache, hidden: torch.Tensor, logits: torch.Tensor, use_graphs: bool
    ) -> None:
        self.talker, self.cache, self.hidden, self.logits = talker, cache, hidden, logits
        self.device = hidden.device
        n, length, width = PROMPTS[-1], LENGTHS[-1], hidden.shape[1]
        self.embeds = torch.zeros(n, length, width, dtype=hidden.dtype, device=self.device)
        self.rows = torch.zeros(n, dtype=torch.long, device=self.device)
        self.ends = torch.zeros(n, dtype=torch.long, device=self.device)
        self.scratch = talker.new_cache(n, length) if use_graphs else None  # the fixed-shape path's
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.replays = 0
        self.lengths = tuple(n for n in LENGTHS if n <= cache.capacity)  # captured prompt lengths

    def _forward(
        self, embeds: torch.Tensor, scratch: KVCache, rows: torch.Tensor, ends: torch.Tensor, length: int
    ) -> None:
        n = embeds.shape[0]
        states = self.talker.model(embeds, scratch, 0)
        last = states[torch.arange(n, device=self.device), ends]
        self.cache.k[:, :, :, :length].index_copy_(1, rows, scratch.k[:, :n, :, :length])
        self.cache.v[:, :, :, :length].index_copy_(1, rows, scratch.v[:, :n, :, :length])
        self.hidden.index_copy_(0, rows, last)
        self.logits.index_copy_(0, rows, self.talker.codec_head(last).float())

    def _body(self, n: int, length: int) -> None:
        assert self.scratch is not None
        self._forward(self.embeds[:n, :length], self.scratch.view(slice(0, n)), self.rows[:n], self.ends[:n], length)

    @torch.inference_mode()
    def capture(self, pool: tuple[int, int]) -> None:
        """Warm up and capture every (prompts, length) bucket; row 0 is scribbled on (idle at start-up)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for n in PROMPTS:
                for length in self.lengths:
                    self._body(n, length)
        torch.cuda.current_stream().wait_stream(stream)
        for n in PROMPTS:
            for length in self.lengths:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._body(n, length)
                self.graphs[n, length] = graph

    def run(
        self,
        prompts: list[torch.Tensor],
        rows: list[int],
        rows_t: torch.Tensor,
        to_device: Callable[[list, torch.dtype], torch.Tensor],
    ) -> None:
        """Prefill `prompts` ((1, P_i, H) each) into `rows` (`rows_t` the same on the device)."""
        lengths = [p.shape[1] for p in prompts]
        longest = max(lengths)
        n = len(prompts)
        bucket_n = next((b for b in PROMPTS if b >= n), None)
        bucket_len = next((b for b in self.lengths if b >= longest), None)
        graph = self.graphs.get((bucket_n, bucket_len)) if bucket_n and bucket_len else None
        if bucket_n is None or bucket_len is None or self.scratch is None or (self.graphs and graph is None):
            embeds = torch.zeros(n, longest, self.hidden.shape[1], dtype=self.hidden.dtype, device=self.device)
            for i, prompt in enumerate(prompts):
                embeds[i, : lengths[i]] = prompt[0]
            ends = to_device([length - 1 for length in lengths], torch.long)
            self._forward(embeds, self.talker.new_cache(n, longest), rows_t, ends, longest)
            return
        pad = bucket_n - n  # repeat the last prompt: same row, same values
        padded, padded_lengths = prompts + prompts[-1:] * pad, lengths + lengths[-1:] * pad
        # Every prompt's positions into the buffer in one copy: (prompt i, position t) is row
        # i * width + t of the flattened buffer. One host-to-device copy carries those places,
        # the rows and the last positions.
        width, m = self.embeds.shape[1], sum(padded_lengths)
        places = flat_rows([i * width for i in range(bucket_n)], padded_lengths)
        ends = [length - 1 for length in padded_lengths]
        index = to_device([*places, *(rows + rows[-1:] * pad), *ends], torch.long)
        joined = torch.cat([p[0] for p in padded]).to(self.embeds.dtype)
        self.embeds.view(-1, self.embeds.shape[2]).index_copy_(0, index[:m], joined)
        self.rows[:bucket_n].copy_(index[m : m + bucket_n])
        self.ends[:bucket_n].copy_(index[m + bucket_n :])
        if graph is not None:
            graph.replay()
            self.replays += 1
        else:  # no graphs here (the CPU): the same body, eagerly
            self._body(bucket_n, bucket_len)
