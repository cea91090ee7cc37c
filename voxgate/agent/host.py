"""What the voice agent needs from the process that hosts it, as a `Protocol`.

The server's state (`voxgate.serving.state.ServerState`) satisfies it structurally, so the
agent depends on this contract, not on the server: the layers stay `speech <- {agent,
serving}` with no edge between the two transports (tests/unit/test_layers.py). A test host
may be any object with these members.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from voxgate.bridge.llm import LLMConfig
from voxgate.bridge.pipeline import ChunkStream
from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.speech.limits import StreamLimiter
from voxgate.speech.starter import StarterCache
from voxgate.speech.workers import EnginePool
from voxgate.types import SynthesisRequest


class LLMSlots(Protocol):
    def slot(self, client: str) -> AbstractAsyncContextManager[Any]: ...


class AgentMetrics(Protocol):
    agent: Histogram  # seconds from the end of the user's turn, by stage
    agent_turns: Counter  # turns by how they ended


class VoicePlan(Protocol):
    request: SynthesisRequest


class AgentHost(Protocol):
    settings: Settings
    starters: StarterCache  # cached openers per voice
    limiter: StreamLimiter  # every transport's stream slots and voices
    engine_pool: EnginePool  # engine calls, most urgent first
    executor: Executor  # blocking work that is not an engine stream (STT)
    llm_limiter: LLMSlots  # every LLM call's slot, fair across clients
    metrics: AgentMetrics

    def llm_config(self, **options: Any) -> LLMConfig: ...

    def require_engine(self) -> Engine: ...

    def voice_plan(
        self, voice: str | None, fmt: str, sample_rate: int | None, language: str | None, client: str | None = None
    ) -> VoicePlan: ...

    def opener(self, request: SynthesisRequest, engine_stream: Callable[[str], ChunkStream]) -> ChunkStream | None: ...

    def history_chars(self) -> int: ...
