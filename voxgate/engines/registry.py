"""Engines by name. Factories are imported lazily so a tone server never loads piper."""

from __future__ import annotations

import importlib

from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.types import UnknownEngine

_FACTORIES: dict[str, str] = {
    "tone": "voxgate.engines.tone:create",
    "piper": "voxgate.engines.piper:create",
    "qwen3": "voxgate.engines.qwen3.engine:create",
}


def engine_names() -> list[str]:
    return sorted(_FACTORIES)


def register(name: str, factory_path: str) -> None:
    """Register `module:function`, a callable `(Settings) -> Engine`."""
    _FACTORIES[name] = factory_path


def create_engine(name: str, settings: Settings) -> Engine:
    try:
        module_name, func_name = _FACTORIES[name].split(":")
    except KeyError:
        raise UnknownEngine(f"no engine named {name!r}; available: {', '.join(engine_names())}") from None
    factory = getattr(importlib.import_module(module_name), func_name)
    return factory(settings)
