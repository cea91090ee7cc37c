"""The process runtime: uvloop where installed, and a settled heap."""

import asyncio
import gc
import sys

import pytest
from pydantic import ValidationError

from voxgate.config import Settings
from voxgate.runtime import loop_name, run, set_switch_interval, settle_heap


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


def test_the_switch_interval_is_set_in_ms_and_the_setting_defaults_below_pythons():
    before = sys.getswitchinterval()
    try:
        set_switch_interval(0.5)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
    assert Settings().gil_switch_ms < 5  # Python's own is 5 ms
    with pytest.raises(ValidationError):
        Settings(gil_switch_ms=0)
