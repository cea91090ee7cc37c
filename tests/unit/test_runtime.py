"""The process runtime: uvloop where installed, and a settled heap."""

import asyncio
import gc

from voxgate.runtime import loop_name, run, settle_heap


def test_run_uses_the_loop_loop_name_reports():
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    module = run(which())
    assert module.startswith("uvloop") == (loop_name() == "uvloop")


def test_uvloop_is_installed_where_voxgate_is():
    assert loop_name() == "uvloop"  # a dependency on Linux (pyproject.toml)


def test_settle_heap_freezes_what_survives_a_collection():
    try:
        frozen = settle_heap()
        assert frozen == gc.get_freeze_count() > 1000  # this process has imported plenty
        assert gc.collect() >= 0  # collections still run, over what came after
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
