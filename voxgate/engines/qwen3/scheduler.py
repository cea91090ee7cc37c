"""Which streams run on the next step: a pure-Python scheduler (no torch), unit-tested on the CPU.

The runner asks `plan()` before every step and gets plain data back: the streams to
prefill now (each with the batch row it will hold), every stream that decodes in this step
(the new ones included: a prefill leaves the first code ready to draw), and the batch-size
bucket (1, 2, 4, 8, ...) whose captured graph covers the rows in use. Policy:
- a stream waits in a queue ordered by priority (higher first), then by when its listener
  needs its first audio (earliest first; a stream with no such time is due when it arrives),
  then arrival;
- at most `max_running` streams decode together; a new one takes the lowest free row, at
  most `max_prefills_per_step` per step, so prefills interleave with decoding instead of
  stalling the running streams;
- a full queue refuses new streams with `Busy` rather than slowing everyone down, and each
  waiting stream can see its position and how long it has waited;
- cancel frees a slot at once, whether the stream is waiting or running;
- the deadline rule: given how far each stream's audio is ahead of its listener (`ahead`,
  seconds; streams not played in real time are absent) and a `lead`, a running stream more
  than `lead` ahead is held (stays in its row, does not move) while another running stream
  is within its lead, so steps carry only what a listener is about to need: less work per
  step for the host, a smaller bucket where the high rows are held. Nobody is held while
  streams somebody listens to wait for a row (every stream runs, to free rows sooner), nor
  when every stream is ahead (the step is spare capacity: it builds buffer);
- a stream whose reader has fallen behind (`stalled`: the runner says which, by the frames
  made and not yet taken) is held whenever no stream somebody listens to waits for a row, and
  counts as ahead for the deadline rule: audio nobody has taken cannot be helped by more of it, so a client that
  stops reading costs neither frames in memory nor the others' steps;
- nobody listening (`absent`: a dropped WebSocket's session, voicing into its replay buffer
  for a resume) is the lowest priority of all: such a running stream is held while any stream
  that somebody listens to is due, and when a stream somebody listens to waits for a row, an
  absent one gives its row up (`Plan.preempted`; the caller voices that text again later):
  departed listeners' work never stands between a new listener and its first audio.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum

from voxgate.types import Busy, NotFound

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Phase(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(slots=True)
class Stream:
    stream_id: str
    priority: int = 0
    arrival: int = 0  # set by the scheduler: order of arrival
    enqueued_at: float = 0.0  # caller's clock, for queue-time reporting
    due: float = 0.0  # caller's clock: when its listener needs its first audio (the queue's order)
    phase: Phase = Phase.WAITING
    frames: int = 0
    row: int = -1  # batch row while running


@dataclass(frozen=True, slots=True)
class Plan:
    prefill: tuple[tuple[str, int], ...]  # (stream, row) admitted now: run their prompts first
    decode: tuple[tuple[str, int], ...]  # (stream, row) of every running stream that moves, new ones included
    bucket: int  # captured batch size covering every row that moves (0 when nothing runs)
    held: tuple[tuple[str, int], ...] = ()  # (stream, row) running but kept still this step (the deadline rule)
    preempted: tuple[tuple[str, int], ...] = ()  # (stream, row) stopped to free its row: end them before prefills


@dataclass
class Scheduler:
    max_running: int = 64
    max_waiting: int = 256
    max_prefills_per_step: int = 2
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    _streams: dict[str, Stream] = field(default_factory=dict)
    _waiting: list[tuple[int, float, int, str]] = field(default_factory=list)  # (-priority, due, arrival, id)
    _running: list[str] = field(default_factory=list)
    _arrivals: itertools.count = field(default_factory=itertools.count)
    _free_rows: list[int] = field(default_factory=list)  # a heap: the lowest free row first

    def __post_init__(self) -> None:
        if self.max_running > self.buckets[-1]:
            raise ValueError(f"max_running {self.max_running} exceeds the largest bucket {self.buckets[-1]}")
        self._free_rows = list(range(self.max_running))

    def add(self, stream_id: str, priority: int = 0, now: float = 0.0, due: float | None = None) -> int:
        """Queue a stream (`due`: when its first audio is needed, else `now`); returns its
        position in the queue (0 = next). Raises Busy when full."""
        if stream_id in self._streams:
            raise ValueError(f"stream {stream_id!r} is already scheduled")
        if len(self._waiting) >= self.max_waiting:
            raise Busy(f"{len(self._waiting)} streams are already waiting; retry shortly")
        stream = Stream(stream_id, priority, next(self._arrivals), now, now if due is None else due)
        self._streams[stream_id] = stream
        bisect.insort(self._waiting, self._key(stream))
        return self.position(stream_id)

    @staticmethod
    def _key(stream: Stream) -> tuple[int, float, int, str]:
        return (-stream.priority, stream.due, stream.arrival, stream.stream_id)

    def position(self, stream_id: str) -> int:
        """Place in the waiting queue (0 = admitted next); -1 once running."""
        stream = self._get(stream_id)
        if stream.phase is not Phase.WAITING:
            return -1
        return bisect.bisect_left(self._waiting, self._key(stream))

    def waited(self, stream_id: str, now: float) -> float:
        return now - self._get(stream_id).enqueued_at

    def plan(
        self,
        ahead: Mapping[str, float] | None = None,
        lead: float = math.inf,
        stalled: Collection[str] = (),
        absent: Collection[str] = (),
    ) -> Plan:
        """Admit what fits (priority first) and say what runs on the next step; with `ahead`
        (stream -> seconds its audio is ahead of its listener), hold by the deadline rule; hold
        the `stalled` streams (their readers are behind) unless a listened-to stream waits for
        a row; the `absent` streams (nobody listens) are held while others are due, and give
        their rows to streams somebody listens to that wait for one."""
        preempted = self._preempt(absent)
        admitted: list[tuple[str, int]] = []
        regrouped = bool(absent and self._waiting)
        if regrouped:  # streams somebody listens to are admitted first (stable: in queue order)
            self._waiting.sort(key=lambda k: k[-1] in absent)
        while self._waiting and len(self._running) < self.max_running and len(admitted) < self.max_prefills_per_step:
            *_, stream_id = self._waiting.pop(0)
            stream = self._streams[stream_id]
            stream.phase, stream.row = Phase.RUNNING, heapq.heappop(self._free_rows)
            self._running.append(stream_id)
            admitted.append((stream_id, stream.row))
        if regrouped:
            self._waiting.sort()  # the queue's own order again (positions and inserts bisect it)
        moving, held = self._running, []
        listeners_wait = any(i not in absent for *_, i in self._waiting)  # absent ones waiting change nothing
        if not listeners_wait and (ahead or stalled or absent):
            still = {i for i in self._running if i in stalled}
            ahead = ahead or {}
            far = {i for i in self._running if i not in still and (i in absent or ahead.get(i, -math.inf) > lead)}
            if len(still) + len(far) == len(self._running):
                far = set()  # nobody due: the step is spare capacity for every stream that can use it
            moving = [i for i in self._running if i not in still and i not in far]
            held = [i for i in self._running if i in still or i in far]
        decode = tuple((i, self._streams[i].row) for i in moving)
        rows = max((row for _, row in decode), default=-1) + 1
        return Plan(tuple(admitted), decode, self.bucket_for(rows), tuple((i, self._streams[i].row) for i in held),
                    preempted)  # fmt: skip

    def _preempt(self, absent: Collection[str]) -> tuple[tuple[str, int], ...]:
        """Running streams nobody listens to, dropped so that waiting streams somebody listens
        to get rows now: one for each such waiting stream that no free row takes, the latest
        admitted first (the least voiced)."""
        if not absent or not self._waiting:
            return ()
        wanting = sum(1 for *_, i in self._waiting if i not in absent)
        short = wanting - (self.max_running - len(self._running))
        victims = [i for i in reversed(self._running) if i in absent][: max(0, short)]
        out = tuple((i, self._streams[i].row) for i in victims)
        for i in victims:
            self._drop(i, Phase.CANCELLED)
        return out

    def bucket_for(self, n: int) -> int:
        if n == 0:
            return 0
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def advance(self, stream_id: str, frames: int = 1) -> None:
        self._get(stream_id).frames += frames

    def finish(self, stream_id: str) -> None:
        """The stream ended normally (EOS or its length limit)."""
        self._drop(stream_id, Phase.FINISHED)

    def cancel(self, stream_id: str) -> None:
        """Free the stream's slot or queue place now; unknown ids are ignored (already gone)."""
        if stream_id in self._streams:
            self._drop(stream_id, Phase.CANCELLED)

    def _drop(self, stream_id: str, phase: Phase) -> None:
        stream = self._streams.pop(stream_id)
        if stream.phase is Phase.RUNNING:
            self._running.remove(stream_id)
            heapq.heappush(self._free_rows, stream.row)
        else:
            self._waiting.remove(self._key(stream))
        stream.phase = phase

    def _get(self, stream_id: str) -> Stream:
        try:
            return self._streams[stream_id]
        except KeyError:
            raise NotFound(f"no scheduled stream {stream_id!r}") from None

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)
