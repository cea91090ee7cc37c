"""How long one batched step takes at each bucket size, and so how many streams stay real-time.

Every running stream gets one 80 ms frame per step, and a step's cost is set by its bucket
(the captured batch size covering the rows in use), not by the streams in it. So the streams
the runner can keep ahead of their listeners are the rows of the largest bucket whose step
(with the host work around it) fits a share of a frame: at `utilization` 0.6, a
step of at most 48 ms. The rest of the frame is the margin for prefill bursts, the event
loop and a step that runs long.

Costs come from two places: a profile at start-up (each captured graph replayed, outputs
copied to the host: the GPU's part) and every step the runner takes afterwards (a moving
average of the loop's period per bucket: the host's part too, and whatever else shares the
GPU). The larger of the two counts, so a profile taken on an idle machine never makes a
busy one look free. Without a profile (no CUDA graphs: nothing fixed to profile) there is no
estimate: the averages alone would only ever cover the buckets already reached. Pure Python:
unit-tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

SMOOTHING = 0.05  # weight of each new step in a bucket's moving average (about the last 20 steps)


@dataclass
class StepCosts:
    profiled: dict[int, float] = field(default_factory=dict)  # bucket -> seconds (start-up profile)
    live: dict[int, float] = field(default_factory=dict)  # bucket -> seconds (moving average)

    def record(self, bucket: int, seconds: float) -> None:
        """One step's loop period, less the prefills it also ran (new streams' bursts are
        what the share of a frame left free is for): the GPU's step and the host's work around
        it, the hand-out of every row's frame and the waits for the GIL included, which past
        about 128 streams cost more than the step itself (BENCHMARKS.md). The average starts
        from the profile, and one slow period moves it by `SMOOTHING` of the difference."""
        old = self.live.get(bucket, self.profiled.get(bucket, seconds))
        self.live[bucket] = old + SMOOTHING * (seconds - old)

    def cost(self) -> dict[int, float]:
        """Each profiled bucket's step in seconds: the larger of its profile and its average."""
        return {b: max(c, self.live.get(b, 0.0)) for b, c in sorted(self.profiled.items())}

    def realtime_rows(self, frame_s: float, utilization: float, slots: int) -> int | None:
        """See `realtime_rows`; None without a profile."""
        costs = self.cost()
        return realtime_rows(costs, frame_s, utilization, slots) if costs else None


def realtime_rows(costs: Mapping[int, float], frame_s: float, utilization: float, slots: int) -> int:
    """The most streams whose steps fit `utilization` of a frame: the largest bucket such that
    it and every smaller measured bucket fit (a larger batch never steps faster, so a slow
    small bucket is not outvoted by a lucky large one). Buckets above the largest measured one
    are not guessed. At least 1: one stream is always served, real-time or not."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    budget, rows = frame_s * utilization, 0
    for bucket in sorted(costs):
        if costs[bucket] > budget:
            break
        rows = bucket
    return max(1, min(rows, slots))
