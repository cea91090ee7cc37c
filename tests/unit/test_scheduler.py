"""The multi-stream scheduler's policy, with no GPU and no torch."""

import pytest

from voxgate.engines.qwen3.scheduler import Scheduler
from voxgate.types import Busy, NotFound


def test_admits_into_free_slots_a_few_prefills_per_step():
    s = Scheduler(max_running=4, max_prefills_per_step=2)
    for name in "abcde":
        s.add(name)
    first = s.plan()
    assert first.prefill == ("a", "b") and first.decode == () and first.bucket == 0
    second = s.plan()
    assert second.prefill == ("c", "d") and second.decode == ("a", "b") and second.bucket == 2
    third = s.plan()
    assert third.prefill == () and third.decode == ("a", "b", "c", "d") and third.bucket == 4
    assert s.waiting == 1 and s.position("e") == 0


def test_higher_priority_is_admitted_first_then_arrival_order():
    s = Scheduler(max_running=1, max_prefills_per_step=1)
    s.add("background-1", priority=0)
    s.add("background-2", priority=0)
    s.add("live-turn", priority=10)
    assert s.position("live-turn") == 0 and s.position("background-2") == 2
    assert s.plan().prefill == ("live-turn",)
    s.finish("live-turn")
    assert s.plan().prefill == ("background-1",)


def test_cancel_frees_a_running_slot_or_a_queue_place_at_once():
    s = Scheduler(max_running=1, max_prefills_per_step=1)
    s.add("a")
    s.add("b")
    s.add("c")
    s.plan()
    s.cancel("a")  # running
    s.cancel("c")  # waiting
    assert s.running == 0 and s.waiting == 1
    assert s.plan().prefill == ("b",)
    s.cancel("unknown")  # already gone: no error


def test_a_full_queue_says_busy_instead_of_degrading_everyone():
    s = Scheduler(max_running=1, max_waiting=2)
    s.add("a")
    s.add("b")
    with pytest.raises(Busy):
        s.add("c")
    s.plan()  # "a" leaves the queue
    assert s.add("c") == 1


def test_buckets_pad_the_decode_batch_to_a_captured_size():
    s = Scheduler(max_running=64)
    assert [s.bucket_for(n) for n in (1, 2, 3, 5, 9, 17, 33, 64)] == [1, 2, 4, 8, 16, 32, 64, 64]
    with pytest.raises(ValueError):
        Scheduler(max_running=65)


def test_queue_time_and_errors():
    s = Scheduler()
    s.add("a", now=10.0)
    assert s.waited("a", now=12.5) == 2.5
    with pytest.raises(ValueError):
        s.add("a")
    with pytest.raises(NotFound):
        s.position("zzz")
    s.plan()
    assert s.position("a") == -1
    s.advance("a", 3)
    s.finish("a")
    with pytest.raises(NotFound):
        s.position("a")
