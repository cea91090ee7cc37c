"""The qwen3 runner's phase trace (`VOXGATE_QWEN3_TRACE_STEPS`): a diagnostic, but one whose lines
must say what happened, only as often as asked."""

import logging

from voxgate.engines.qwen3.runner import PhaseTrace


def iteration(trace: PhaseTrace, phases: list[str], **counts: int) -> None:
    trace.start()
    for phase in phases:
        trace.mark(phase)
    trace.end(**counts)


def test_it_logs_the_first_n_iterations_after_each_idle_spell_with_each_phase(caplog):
    trace = PhaseTrace(2)
    with caplog.at_level(logging.INFO, logger="voxgate.engines.qwen3.runner"):
        iteration(trace, ["plan", "prefill"], prefilled=3, stepped=0)  # before any idle spell: nothing
        trace.woken()
        for _ in range(3):
            iteration(trace, ["plan", "launch", "hand_out"], prefilled=0, stepped=4)
        trace.woken()
        iteration(trace, ["plan", "prefill", "launch"], prefilled=5, stepped=5)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3  # two after the first wake, one after the second
    assert all("wall/cpu" in line for line in lines)
    assert "plan " in lines[0] and "launch " in lines[0] and "hand_out " in lines[0] and "stepped 4" in lines[0]
    assert "prefill " in lines[2] and "prefilled 5" in lines[2] and "hand_out" not in lines[2]


def test_off_it_logs_nothing(caplog):
    trace = PhaseTrace(0)
    with caplog.at_level(logging.INFO, logger="voxgate.engines.qwen3.runner"):
        trace.woken()
        iteration(trace, ["plan", "launch"], stepped=1)
    assert caplog.records == []
