"""The thread that drives the batched decoder: admits streams as the scheduler says, steps
every running stream together, and hands each stream its frames through its own queue.

Callers (`Qwen3Engine.stream`, one per request, on their own threads) `submit` a `Job` and
read PCM frames from `job.frames` until `END`; cancelling the job's token frees its row at
the next step. One failing prefill fails that job alone. A frame is `(pcm, pcm16)`: the float
samples, and with `pcm16` on the same as 16-bit PCM, converted once per step for every row
(else None: the transport converts, a few numpy calls a frame on the event loop, each of which
gives the GIL up and waits to get it back while 64 engine threads want it).

Deadlines: a job played in real time carries `play_at`, when its listener needs its first
audio (now for a new utterance; when the audio before it runs out for a later segment of the
same session), and usually the listener's own clock. How far a job is *ahead* is the audio its
listener has in hand (`listener.due(now) - now`: what the transport has sent, not what the
runner has made, so audio stuck behind a busy event loop does not count); a job with
`play_at` but no clock is ahead by the frames handed out beyond a clock that starts at
`play_at` (or its first frame, if later). Before each step the runner gives the scheduler every
job's lead, and a job more than `lead_s` ahead is held while others are due (`scheduler.py`'s
deadline rule; `batch.py` keeps a held row's state exactly). Jobs without `play_at` (a whole
file, a benchmark) are never held by that rule.

The loop keeps one step queued behind the running one, so the GPU does not wait for the host;
`launch_idle` counts the launches that came after the GPU had finished the step before (the host
was the bottleneck). Launching each step just before the running one ends instead, so streams
arriving meanwhile join it a step sooner, was measured on an H100 and gained nothing
(BENCHMARKS.md issue 17, "late launch"; the switch is in its commit, 4d95d13).

Listeners absent: a job whose listener is not there (`ListenerClock.absent`: a dropped
WebSocket's session) is held while others are due and, when a job somebody listens to waits for
a row, stopped with `Preempted` to free its row (`scheduler.py`); the caller voices its text
again later.

Readers behind: a job whose reader has `backlog_s` of frames it has not taken (a client that
stopped reading, a transport pacing its sends, a benchmark's slow client) is held, played in
real time or not, unless streams somebody listens to wait for a row (then it runs on, to free
its row), and moves again once its reader takes a frame. Frames made and not taken are bounded that way, and such a
job never counts as due: otherwise one reader that stopped could keep every other stream at its
listener's pace (their steps held while its, useless, moved).
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from voxgate.audio import to_pcm16
from voxgate.engines.qwen3.batch import Admission, BatchDecoder, PendingStep
from voxgate.engines.qwen3.codec import DecoderState
from voxgate.engines.qwen3.config import SamplingParams
from voxgate.engines.qwen3.prompt import Prompt, PromptPlan
from voxgate.engines.qwen3.scheduler import Scheduler
from voxgate.engines.qwen3.step_cost import StepCosts
from voxgate.types import CancelToken, EngineFailure, ListenerClock, Preempted

log = logging.getLogger(__name__)
END = None  # put on a job's queue after its last frame


@dataclass(eq=False)
class Job:
    """One stream inside the runner."""

    stream_id: str
    prompt: Prompt | PromptPlan  # a plan is embedded by the decoder with the others admitted with it
    params: SamplingParams
    seed: int
    limit: int  # code-0 draws at most (the last draw yields no frame, as in the reference)
    cancel: CancelToken
    priority: int = 0
    context: DecoderState | None = None
    play_at: float | None = None  # perf_counter time its listener needs its first audio; None: not real time
    listener: ListenerClock | None = None  # the listener's playback clock (how much audio it has in hand)
    frames: queue.Queue[tuple[np.ndarray, np.ndarray | None] | BaseException | None] = field(
        default_factory=queue.Queue
    )
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # when its prefill was launched
    first_step_at: float | None = None  # when the step with its first frame was launched
    first_step_rows: int = 0  # the streams in that step
    admitted_with: int = 0  # the streams prefilled together with it (itself included)
    first_frame_at: float | None = None  # when its first frame was handed out
    row: int = -1
    draws: int = 0
    closed: bool = False  # set by the reader when it stops reading (client gone, generator closed)
    ended: bool = False  # set by the runner once the job has left it
    # Called (on the runner's thread) after each thing put on `frames`, for a reader that polls
    # instead of blocking on the queue (`PolledFrames`); it must not raise and must not block.
    wake: Callable[[], None] | None = None

    def put(self, item: tuple[np.ndarray, np.ndarray | None] | BaseException | None) -> None:
        self.frames.put(item)
        if self.wake is not None:
            self.wake()

    @property
    def stopped(self) -> bool:
        return self.closed or self.cancel.cancelled


@dataclass
class RunnerStats:
    steps: int = 0
    admitted: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    queue_seconds: float = 0.0  # summed over admitted streams
    busy_seconds: float = 0.0  # wall time spent in prefills and steps
    rows_stepped: int = 0  # sum over steps of the streams in the step
    rows_held: int = 0  # sum over steps of the streams held (the deadline rule, readers behind)
    rows_stalled: int = 0  # of those, held because their readers were behind
    launch_idle: int = 0  # steps launched after the GPU had finished the one before (it waited for the host)
    preempted: int = 0  # streams nobody listened to, stopped to free their rows


DEFAULT_LEAD_S = 1.5  # a real-time stream with more audio than this ahead of its listener may be held
# A stream with this much audio made and not taken by its reader is held: well above the lead, so
# frames stuck behind a busy event loop for a moment do not trigger it (holding on frames made
# rather than audio sent was tried for the deadline rule and cost underruns under overload).
DEFAULT_BACKLOG_S = 4.0


class PhaseTrace:
    """A diagnostic (`trace_steps`): the wall and this thread's CPU time of each phase of the
    runner's first `n` iterations after each idle spell, one log line per iteration. Wall well
    above CPU in a phase that only launches is time spent waiting for the GIL (or a GPU sync)."""

    def __init__(self, n: int) -> None:
        self.n, self.left = n, 0
        self._marks: list[tuple[str, float, float]] = []

    def woken(self) -> None:
        self.left = self.n

    def start(self) -> None:
        if self.left:
            self._marks = [("", time.perf_counter(), time.thread_time())]

    def mark(self, phase: str) -> None:
        if self.left:
            self._marks.append((phase, time.perf_counter(), time.thread_time()))

    def end(self, **counts: int) -> None:
        if not self.left or not self._marks:
            return
        self.left -= 1
        marks, self._marks = self._marks, []
        parts = [f"{phase} {1e3 * (w - w0):.2f}/{1e3 * (c - c0):.2f}"
                 for (_, w0, c0), (phase, w, c) in itertools.pairwise(marks)]  # fmt: skip
        extra = " ".join(f"{k} {v}" for k, v in counts.items())
        log.info("runner iteration at %.3f, ms wall/cpu: %s; %s", marks[0][1], ", ".join(parts), extra)


class Runner:
    def __init__(
        self,
        decoder: BatchDecoder,
        scheduler: Scheduler,
        frame_s: float = 0.08,
        lead_s: float = DEFAULT_LEAD_S,
        pcm16: bool = False,
        backlog_s: float = DEFAULT_BACKLOG_S,
        trace_steps: int = 0,
    ) -> None:
        self.decoder, self.scheduler = decoder, scheduler
        self.frame_s, self.lead_s = frame_s, lead_s  # lead_s = inf: never hold
        self.backlog_frames = max(1, math.ceil(backlog_s / frame_s)) if math.isfinite(backlog_s) else None
        self.pcm16 = pcm16  # each step's audio also as 16-bit PCM, converted once for every row
        self.stats = RunnerStats()
        self.trace = PhaseTrace(trace_steps)
        self.costs = StepCosts(dict(decoder.stats.step_s))  # what a step takes per bucket (step_cost.py)
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="qwen3-runner", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> int:
        """Queue a job; returns its place in the queue. Raises `Busy` when the queue is full."""
        with self._lock:
            if self._closed:
                raise EngineFailure("the qwen3 runner is closed")
            due = job.play_at if job.play_at is not None and math.isfinite(job.play_at) else None
            place = self.scheduler.add(job.stream_id, job.priority, job.submitted_at, due)
            self._jobs[job.stream_id] = job
            self._lock.notify()
        return place

    def load(self) -> tuple[int, int]:
        """(running, waiting) streams."""
        with self._lock:
            return self.scheduler.running, self.scheduler.waiting

    def capacity(self, frame_s: float, utilization: float) -> int | None:
        """Streams whose steps fit `utilization` of a frame (see step_cost.py); None unprofiled."""
        with self._lock:
            return self.costs.realtime_rows(frame_s, utilization, self.scheduler.max_running)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        """Run until closed; if the loop itself breaks (e.g. the GPU is lost), every stream,
        queued or running, gets a typed failure and new submissions are refused, rather than
        anyone waiting forever."""
        try:
            self._run()
        except BaseException as exc:
            log.exception("the qwen3 runner stopped")
            with self._lock:
                self._closed = True
                jobs = list(self._jobs.values())
                self._jobs.clear()
            for job in jobs:
                job.ended = True
                job.put(EngineFailure(f"the engine's decode loop stopped: {exc}"))

    def _run(self) -> None:
        """Pipelined: step n+1 is launched before step n's frames are handed out, so the GPU
        never waits for the host's bookkeeping. A stream that ends at step n may run once more
        in step n+1; that frame is dropped (its row has one spare cache position for it)."""
        pending: tuple[PendingStep, list[Job]] | None = None
        trace = self.trace
        while True:
            with self._lock:
                self._drop_cancelled()
                while not self._closed and not self._jobs and pending is None:
                    self._lock.wait()
                    trace.woken()
                trace.start()
                if self._closed:
                    for job in self._jobs.values():
                        job.put(EngineFailure("the engine is shutting down"))
                    return
                stalled, absent = self._stalled(), self._absent()
                plan = self.scheduler.plan(self._ahead(time.perf_counter()), self.lead_s, stalled, absent)
                for i, _ in plan.preempted:  # before the prefills: their rows are someone else's now
                    self.stats.preempted += 1
                    self._end(self._jobs[i], Preempted("stopped for a stream somebody listens to"))
                if not plan.prefill and not plan.decode and pending is None:
                    # Every running stream's reader is behind: nothing to step until one takes a
                    # frame (readers do not signal it), so look again in a quarter of a frame.
                    self._lock.wait(self.frame_s / 4)
                    continue
            started = time.perf_counter()
            trace.mark("plan")
            if plan.prefill:
                self._prefill([(self._jobs[i], row) for i, row in plan.prefill])
                trace.mark("prefill")
            for _, row in plan.held:  # after the prefills: a prefill starts its row moving
                self.decoder.hold(row, True)
            for _, row in plan.decode:
                self.decoder.hold(row, False)
            self.stats.rows_held += len(plan.held)
            self.stats.rows_stalled += sum(1 for i, _ in plan.held if i in stalled)
            prefilled = time.perf_counter() - started
            jobs = [self._jobs.get(i) for i, _ in plan.decode]  # a failed prefill has left already
            running = [job for job in jobs if job is not None and job.row >= 0]
            launched = None
            if running:
                if pending is not None and pending[0].gpu_finished():
                    self.stats.launch_idle += 1
                at = time.perf_counter()
                try:
                    launched = (self.decoder.launch(plan.bucket, [job.row for job in running]), running)
                except Exception as exc:  # a broken step fails everyone in it; the loop goes on
                    log.exception("qwen3 decode step failed")
                    for job in running:
                        self._end(job, EngineFailure(f"decode step failed: {exc}"))
                for job in running:
                    if job.first_step_at is None:
                        job.first_step_at, job.first_step_rows = at, len(running)
                trace.mark("launch")
            if pending is not None:
                self._hand_out(*pending)
                trace.mark("hand_out")
            trace.end(prefilled=len(plan.prefill), stepped=len(running))
            took = time.perf_counter() - started
            if launched is not None and pending is not None:  # a period in which one step waited for another
                with self._lock:
                    self.costs.record(plan.bucket, took - prefilled)
            pending = launched
            self.stats.busy_seconds += took

    def _absent(self) -> set[str]:
        """Jobs whose listeners are not there (`ListenerClock.absent`), running or waiting."""
        return {i for i, job in self._jobs.items() if job.listener is not None and job.listener.absent}

    def _stalled(self) -> set[str]:
        """Running jobs whose readers have `backlog_s` of frames they have not taken."""
        if self.backlog_frames is None:
            return set()
        return {i for i, job in self._jobs.items() if job.row >= 0 and job.frames.qsize() >= self.backlog_frames}

    def _ahead(self, now: float) -> dict[str, float] | None:
        """Seconds each real-time job's audio is ahead of its listener's clock (see the module)."""
        if not math.isfinite(self.lead_s):
            return None
        ahead = {}
        for job in self._jobs.values():
            if job.play_at is None:
                continue
            if job.listener is not None:
                ahead[job.stream_id] = job.listener.due(now) - now
                continue
            start = job.play_at if job.first_frame_at is None else max(job.play_at, job.first_frame_at)
            ahead[job.stream_id] = start + job.draws * self.frame_s - now
        return ahead

    def _hand_out(self, step: PendingStep, running: list[Job]) -> None:
        try:
            result = step.result()
        except Exception as exc:
            log.exception("qwen3 decode step failed")
            for job in running:
                self._end(job, EngineFailure(f"decode step failed: {exc}"))
            return
        self.stats.steps += 1
        self.stats.rows_stepped += len(running)
        pcm16 = to_pcm16(result.pcm) if self.pcm16 else None  # one conversion for every row
        for job in running:
            if not job.ended:
                self._deliver(
                    job, result.codes[job.row], result.pcm[job.row], None if pcm16 is None else pcm16[job.row]
                )

    def _prefill(self, admitted: list[tuple[Job, int]]) -> None:
        """All streams admitted this step, prefilled together."""
        now = time.perf_counter()
        for job, _ in admitted:
            job.started_at, job.admitted_with = now, len(admitted)
            self.stats.queue_seconds += now - job.submitted_at
            self.stats.admitted += 1
        try:
            self.decoder.admit_many([Admission(row, j.prompt, j.params, j.seed, j.context) for j, row in admitted])
        except Exception as exc:
            log.exception("qwen3 prefill failed")
            for job, row in admitted:
                self.decoder.release(row)  # a half-started row must not keep moving
                self._end(job, EngineFailure(f"prefill failed: {exc}"))
            return
        for job, row in admitted:
            job.row = row

    def _deliver(self, job: Job, codes: np.ndarray, pcm: np.ndarray, pcm16: np.ndarray | None = None) -> None:
        draw = job.draws
        job.draws += 1
        if job.stopped:
            self._end(job, END, cancelled=True)
        elif int(codes[0]) == self.decoder.eos_id or draw >= job.limit - 1:
            self._end(job, END)
        else:
            if job.first_frame_at is None:
                job.first_frame_at = time.perf_counter()
            job.put((pcm, pcm16))

    def _drop_cancelled(self) -> None:
        for job in [j for j in self._jobs.values() if j.stopped]:
            self._end(job, END, cancelled=True)

    def _end(self, job: Job, last: BaseException | None, cancelled: bool = False) -> None:
        """Free the job's row and queue place and close its frame queue (idempotent)."""
        mine = False
        try:
            with self._lock:
                if self._jobs.pop(job.stream_id, None) is None:
                    return
                job.ended = mine = True
                if cancelled:
                    self.scheduler.cancel(job.stream_id)
                    self.stats.cancelled += 1
                else:
                    self.scheduler.finish(job.stream_id) if last is END else self.scheduler.cancel(job.stream_id)
                    self.stats.finished += last is END
                    self.stats.failed += last is not END and not isinstance(last, Preempted)  # counted apart
                if job.row >= 0:
                    self.decoder.release(job.row)  # may raise if the GPU is broken: the reader still hears
        finally:
            if mine:
                job.put(last)
