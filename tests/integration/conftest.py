"""Servers shared by several test modules (each costs seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from voxgate.bench.server import ServerProcess


@pytest.fixture(scope="session")
def bridge() -> Iterator[ServerProcess]:
    """The `make serve` defaults with the embedded LLM: llama.cpp + SmolLM2 writes, Piper speaks."""
    with ServerProcess("piper", env={"LLM_EMBEDDED": "true"}) as server:
        yield server
