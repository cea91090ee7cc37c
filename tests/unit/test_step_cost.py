"""The batched qwen3 engine's capacity from its step cost by bucket (engines/qwen3/step_cost.py)."""

from __future__ import annotations

import pytest

from voxgate.engines.qwen3.step_cost import SMOOTHING, StepCosts, realtime_rows

FRAME_S = 0.08


def test_the_largest_bucket_whose_step_fits_the_share_of_a_frame():
    costs = {1: 0.008, 2: 0.008, 4: 0.009, 8: 0.010, 16: 0.012, 32: 0.020, 64: 0.040, 128: 0.090}
    assert realtime_rows(costs, FRAME_S, 0.6, slots=128) == 64  # 40 ms <= 48 ms < 90 ms
    assert realtime_rows(costs, FRAME_S, 0.2, slots=128) == 16  # 12 ms <= 16 ms < 20 ms
    assert realtime_rows(costs, FRAME_S, 1.0, slots=128) == 64
    assert realtime_rows(costs, FRAME_S, 0.6, slots=48) == 48  # never more than the rows there are


def test_a_slow_small_bucket_is_not_outvoted_by_a_fast_large_one():
    costs = {1: 0.01, 2: 0.06, 4: 0.02}
    assert realtime_rows(costs, FRAME_S, 0.6, slots=4) == 1


def test_one_stream_is_always_served_even_when_no_step_fits():
    assert realtime_rows({1: 0.5, 2: 0.6}, FRAME_S, 0.6, slots=2) == 1


@pytest.mark.parametrize("utilization", [0.0, -0.1, 1.01])
def test_the_share_of_a_frame_must_be_a_fraction(utilization):
    with pytest.raises(ValueError, match="utilization"):
        realtime_rows({1: 0.01}, FRAME_S, utilization, slots=1)


def test_measured_steps_raise_a_profile_but_never_lower_it():
    costs = StepCosts({1: 0.010, 64: 0.030})
    costs.record(64, 0.100)  # one slow step moves the average a little
    assert costs.cost()[64] == pytest.approx(0.030 + SMOOTHING * 0.070)
    assert costs.realtime_rows(FRAME_S, 0.6, slots=64) == 64
    for _ in range(100):  # steps that stay slow move it all the way
        costs.record(64, 0.070)
    assert costs.cost()[64] == pytest.approx(0.070, rel=0.01)
    assert costs.realtime_rows(FRAME_S, 0.6, slots=64) == 1
    for _ in range(200):  # and back down, but never under the profile
        costs.record(64, 0.001)
    assert costs.cost()[64] == 0.030
    assert costs.realtime_rows(FRAME_S, 0.6, slots=64) == 64


def test_each_step_moves_the_average_by_the_smoothing_weight():
    costs = StepCosts({8: 0.010})
    costs.record(8, 0.020)
    costs.record(8, 0.040)
    first = 0.010 + SMOOTHING * 0.010
    assert costs.live[8] == pytest.approx(first + SMOOTHING * (0.040 - first))


def test_without_a_profile_there_is_no_estimate():
    costs = StepCosts()
    costs.record(1, 0.005)  # one bucket seen live says nothing about the larger ones
    assert costs.cost() == {}
    assert costs.realtime_rows(FRAME_S, 0.6, slots=64) is None
