"""Every engine states the contract the server reads (`voxgate.engines.base.Engine`): no
attribute the server uses is looked up with a fallback, so a new engine that forgets one
fails here, not in production."""

from __future__ import annotations

import importlib

import pytest

from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.engines.registry import _FACTORIES, create_engine, engine_names


@pytest.mark.parametrize("name", engine_names())
def test_every_registered_engine_subclasses_the_contract(name):
    module = _FACTORIES[name].split(":")[0]
    found = vars(importlib.import_module(module)).values()
    classes = [v for v in found if isinstance(v, type) and v.__module__ == module]
    assert any(Engine in c.__mro__ for c in classes), f"{name}: no class of {module} subclasses Engine"


@pytest.mark.parametrize("name", ["tone", "piper"])  # qwen3 needs a checkpoint: its class is checked above
def test_an_engine_states_its_parallel_calls_and_counters(name):
    engine = create_engine(name, Settings(engine=name, warmup=False))
    try:
        assert isinstance(engine, Engine)
        assert engine.parallel_calls is None or (isinstance(engine.parallel_calls, int) and engine.parallel_calls > 0)
        counters = engine.counters()
        assert all(isinstance(v, float | int) for group in counters.values() for v in group.values())
    finally:
        engine.close()
