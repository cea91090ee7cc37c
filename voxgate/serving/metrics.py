"""Prometheus metrics, one registry per app so several apps can live in one process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_RTF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
# Where a WebSocket segment's first audio spends its time, in order: waiting behind the
# session's earlier segments, for the client's stream slot, in the engine (to its first chunk
# ready), handing the chunk to the event loop and logging it, and in the writer (pacing, send).
FIRST_AUDIO_STAGES = ("queue", "slot", "engine", "hop", "write")
# The engine stage split by the engine's own clocks (`AudioChunk.marks`, the batched qwen3 runner):
# opening the stream (a worker, the prompt) to its submission, waiting for the step it first
# joins to be launched, on the GPU until its first frame is handed out (the step running before
# it, its prefill, its own step), and the event loop taking the frame.
ENGINE_MARKS = ("submitted", "first_step", "first_frame")
ENGINE_STAGES = ("open", "wait", "gpu", "pickup")
# The readings behind the stages, each kept in the timings ring on the process's clock (`at_ms`,
# ms from CLOCK_ORIGIN): the segment speakable, taken by its synthesiser, given a slot, its first
# chunk ready, handed to the writer, written; the engine's own where it has them (its prefill
# launched too); and the engine's counts for the step it first joined (`batch`).
FIRST_AUDIO_CLOCKS = ("ready", "taken", "slot", "chunk", "hop", "written")
ENGINE_CLOCKS = ("submitted", "prefill", "first_step", "first_frame")
TIMELINE = ("ready", "taken", "slot", *ENGINE_CLOCKS, "chunk", "hop", "written")  # in causal order
ENGINE_COUNTS = ("admitted_with", "first_step_rows")
CLOCK_ORIGIN = time.perf_counter()


class Metrics:
    """The server's Prometheus metrics (names start with `voxgate_`; see the README)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttfa = Histogram(
            "voxgate_ttfa_seconds", "Request in to first audio bytes written, server side.",
            ["endpoint", "starter"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.duration = Histogram(
            "voxgate_stream_seconds", "Request in to last byte written.", ["endpoint"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.first_audio_stages = Histogram(
            "voxgate_first_audio_stage_seconds", "A WebSocket segment's way to its first audio out, by stage: "
            "queue (behind the session's earlier segments), slot, engine (to its first chunk), hop (to the "
            "event loop), write.", ["endpoint", "stage"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.rtf = Histogram("voxgate_rtf", "Wall time / audio duration per completed stream.", ["endpoint"],
                             buckets=_RTF_BUCKETS, registry=r)  # fmt: skip
        self.active_streams = Gauge("voxgate_active_streams", "Audio streams open now.", registry=r)
        self.streams_waiting = Gauge(
            "voxgate_streams_waiting", "Streams of open sessions waiting for a slot (WebSocket segments, replies).",
            registry=r,
        )  # fmt: skip
        self.stream_slots = Gauge(
            "voxgate_stream_slots", "Voices admitted at once now: max_streams, or the engine's real-time capacity.",
            registry=r,
        )  # fmt: skip
        self.requests = Counter("voxgate_requests_total", "Requests by endpoint and status.",
                                ["endpoint", "status"], registry=r)  # fmt: skip
        self.errors = Counter("voxgate_errors_total", "Errors by code.", ["code"], registry=r)
        self.cancelled = Counter("voxgate_streams_cancelled_total", "Streams stopped before the end, by reason.",
                                 ["reason"], registry=r)  # fmt: skip
        self.engine_streams = Gauge("voxgate_engine_streams_open", "Engine iterators not yet closed.", registry=r)
        self.engine_chunks = Counter("voxgate_engine_chunks_total", "Chunks produced by the engine.", registry=r)
        self.audio_seconds = Counter("voxgate_audio_seconds_total", "Audio seconds sent to clients.", registry=r)
        self.starter_hits = Counter("voxgate_starter_cache_hits_total", "Requests served a cached opener.",
                                    registry=r)  # fmt: skip
        self.ready = Gauge("voxgate_ready", "1 once warm-up has finished.", registry=r)
        self.bridge = Histogram(
            "voxgate_bridge_seconds", "LLM-to-speech replies: request in to LLM first token / first segment / "
            "first audio, and stop to the last audio written (cancel_to_silence).", ["stage"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.bridge_segments = Counter("voxgate_bridge_segments_total", "Bridge segments by what cut them "
                                       "(starter, punctuation, length, flush).", ["trigger"], registry=r)  # fmt: skip
        self.bridge_dropped = Counter("voxgate_bridge_dropped_total", "Stale segments dropped by the 'latest' policy.",
                                      registry=r)  # fmt: skip
        self.bridge_queue_peak = Histogram("voxgate_bridge_queue_peak", "Most segments waiting at once, per reply.",
                                           buckets=(0, 1, 2, 3, 5, 8, 13, 21), registry=r)  # fmt: skip
        self.bridge_replies = Counter("voxgate_bridge_replies_total", "Bridge replies by how they ended.", ["status"],
                                      registry=r)  # fmt: skip
        self.agent = Histogram("voxgate_agent_seconds", "Voice agent turns: from the end of the user's turn (VAD) "
                               "to STT done / LLM first token / first segment / TTS first audio / first frame "
                               "published; stage cancel_to_silence: a cut reply's cancel to its last audio out.",
                               ["stage"], buckets=_LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.agent_turns = Counter("voxgate_agent_turns_total", "Voice agent turns by how they ended.", ["status"],
                                   registry=r)  # fmt: skip
        self.ws_sessions = Gauge("voxgate_ws_sessions", "WebSocket sessions held (attached or awaiting resume).",
                                 registry=r)  # fmt: skip
        self.ws_revoiced = Counter(
            "voxgate_ws_segments_revoiced_total",
            "Segments of dropped sessions stopped before their end, to be voiced again whole on resume: "
            "preempted (an engine row was needed by a listener) or parked (their output was full).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.ws_detached = Gauge("voxgate_ws_sessions_detached", "WebSocket sessions awaiting a resume.", registry=r)
        self.ws_tasks = Gauge("voxgate_ws_tasks", "Gateway tasks alive (writers, synthesisers, janitor).", registry=r)
        self.ws_starving = Gauge(
            "voxgate_ws_starving_seconds",
            "Audio in hand under which a gateway listener is starving (twice the recent worst segment start).",
            registry=r,
        )

    def watch_engine(self, counters: Callable[[], dict[str, dict[str, float]]]) -> None:
        """Export an engine's own counters (e.g. CUDA-graph replays, eager fallbacks) on scrape."""
        self.registry.register(_EngineCounters(counters))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCounters(Collector):
    """`voxgate_engine_<group>_total{name=...}` from the engine's `counters()` at scrape time;
    a group named `*_now` holds gauges (`voxgate_engine_<group>{name=...}`)."""

    def __init__(self, counters: Callable[[], dict[str, dict[str, float]]]) -> None:
        self.counters = counters

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        for group, values in self.counters().items():
            kind = GaugeMetricFamily if group.endswith("_now") else CounterMetricFamily
            family = kind(f"voxgate_engine_{group}", f"Engine {kind.__name__[:5].lower()}: {group}.", labels=["name"])
            for name, value in values.items():
                family.add_metric([name], value)
            yield family
