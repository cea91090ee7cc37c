"""The multi-stream scheduler's policy, with no GPU and no torch."""

import pytest

from voxgate.engines.qwen3.scheduler import Scheduler
from voxgate.types import Busy, NotFound


def test_admits_into_free_rows_a_few_prefills_per_step():
    s = Scheduler(max_running=4, max_prefills_per_step=2)
    assert s.plan().bucket == 0  # nothing to run
    for name in "abcde":
        s.add(name)
    first = s.plan()
    assert first.prefill == (("a", 0), ("b", 1)) and first.decode == (("a", 0), ("b", 1)) and first.bucket == 2
    second = s.plan()
    assert second.prefill == (("c", 2), ("d", 3)) and len(second.decode) == 4 and second.bucket == 4
    third = s.plan()
    assert third.prefill == () and [i for i, _ in third.decode] == ["a", "b", "c", "d"]
    assert s.waiting == 1 and s.position("e") == 0


def test_a_freed_row_is_reused_and_the_bucket_covers_the_highest_row_in_use():
    s = Scheduler(max_running=8, max_prefills_per_step=8)
    for name in "abc":
        s.add(name)
    s.plan()
    s.finish("a")  # row 0 frees; b and c keep rows 1 and 2
    assert s.plan().bucket == 4  # rows up to 2 are in use: bucket 4
    s.add("d")
    plan = s.plan()
    assert plan.prefill == (("d", 0),)  # the lowest free row
    s.finish("c")
    assert s.plan().bucket == 2  # rows 0 and 1


def test_higher_priority_is_admitted_first_then_arrival_order():
    s = Scheduler(max_running=1, max_prefills_per_step=1)
    s.add("background-1", priority=0)
    s.add("background-2", priority=0)
    s.add("live-turn", priority=10)
    assert s.position("live-turn") == 0 and s.position("background-2") == 2
    assert s.plan().prefill == (("live-turn", 0),)
    s.finish("live-turn")
    assert s.plan().prefill == (("background-1", 0),)


def test_cancel_frees_a_running_slot_or_a_queue_place_at_once():
    s = Scheduler(max_running=1, max_prefills_per_step=1)
    s.add("a")
    s.add("b")
    s.add("c")
    s.plan()
    s.cancel("a")  # running
    s.cancel("c")  # waiting
    assert s.running == 0 and s.waiting == 1
    assert s.plan().prefill == (("b", 0),)
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
    s = Scheduler(max_running=256)
    assert [s.bucket_for(n) for n in (1, 2, 3, 5, 9, 17, 33, 64, 65, 129, 256)] == [1, 2, 4, 8, 16, 32, 64, 64, 128,
                                                                                    256, 256]  # fmt: skip
    with pytest.raises(ValueError):
        Scheduler(max_running=257)


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


def test_among_equal_priorities_the_stream_needed_soonest_is_admitted_first():
    s = Scheduler(max_running=1, max_prefills_per_step=1)
    s.add("running")
    s.plan()
    s.add("later-segment", now=10.0, due=14.0)  # its listener has 4 s of audio left
    s.add("new-utterance", now=11.0)  # due when it arrives
    s.add("no-deadline", now=12.0)
    s.add("detached", priority=-10, now=9.0, due=9.0)  # lower priority goes last whatever its deadline
    assert [s.position(i) for i in ("new-utterance", "no-deadline", "later-segment", "detached")] == [0, 1, 2, 3]
    s.finish("running")
    assert s.plan().prefill == (("new-utterance", 0),)
    s.cancel("later-segment")  # a queue place found by its key and removed
    assert s.position("detached") == 1


def _four_running() -> Scheduler:
    """Streams a..d running in rows 0..3, room for more."""
    s = Scheduler(max_running=8, max_prefills_per_step=8)
    for name in "abcd":
        s.add(name)
    s.plan()
    return s


def test_the_deadline_rule_holds_streams_far_ahead_only_while_another_is_due():
    s = _four_running()
    lead = 1.5
    plan = s.plan({"a": 0.2, "b": 9.0, "c": 3.0, "d": 9.0}, lead)
    assert plan.decode == (("a", 0),) and plan.held == (("b", 1), ("c", 2), ("d", 3))
    assert plan.bucket == 1  # the held high rows are not computed at all
    # A stream with no clock (absent: not played in real time) is always due.
    plan = s.plan({"a": 9.0, "b": 9.0, "c": 9.0}, lead)
    assert [i for i, _ in plan.decode] == ["d"] and plan.bucket == 4
    # Every stream ahead: nobody is held (the step is spare capacity).
    plan = s.plan({"a": 9.0, "b": 9.0, "c": 9.0, "d": 2.0}, lead)
    assert plan.held == () and len(plan.decode) == 4
    # Exactly at the lead counts as due.
    assert [i for i, _ in s.plan({"a": 1.5, "b": 1.6, "c": 9.0, "d": 9.0}, lead).decode] == ["a"]
    # No clocks, or an infinite lead: the rule is off.
    assert s.plan().held == () and s.plan({"a": 9.0, "b": 0.0}, float("inf")).held == ()


def test_a_stream_whose_reader_is_behind_is_held_and_counts_as_ahead():
    s = _four_running()
    lead = 1.5
    # Behind its reader: held with or without clocks, even when every other stream is ahead.
    plan = s.plan(None, lead, stalled={"b"})
    assert plan.held == (("b", 1),) and [i for i, _ in plan.decode] == ["a", "c", "d"]
    plan = s.plan({"a": 9.0, "c": 9.0, "d": 9.0}, lead, stalled={"b"})
    assert plan.held == (("b", 1),) and len(plan.decode) == 3  # the rest: spare capacity, all move
    # It never counts as due: with it starved by its clock, the far streams are not held for it.
    plan = s.plan({"a": 9.0, "b": 0.0, "c": 9.0, "d": 9.0}, lead, stalled={"b"})
    assert plan.held == (("b", 1),)
    # Beside a due stream, the far ones are held as before.
    plan = s.plan({"a": 0.0, "b": 0.0, "c": 9.0, "d": 9.0}, lead, stalled={"b"})
    assert [i for i, _ in plan.decode] == ["a"] and plan.held == (("b", 1), ("c", 2), ("d", 3))
    # All behind: nothing moves this step.
    plan = s.plan(None, lead, stalled=set("abcd"))
    assert plan.decode == () and plan.bucket == 0
    # A stream waiting for a row: nobody is held, behind or not (running on frees a row sooner).
    small = Scheduler(max_running=1, max_prefills_per_step=1)
    small.add("x")
    small.add("y")
    small.plan()
    assert small.plan(None, lead, stalled={"x"}).held == () and small.waiting == 1


def test_nobody_is_held_while_streams_wait_for_a_row():
    s = Scheduler(max_running=2, max_prefills_per_step=2)
    for name in "abc":
        s.add(name)
    plan = s.plan({"a": 0.0, "b": 9.0}, 1.5)
    assert s.waiting == 1 and plan.held == ()  # holding b would keep c waiting longer
    s.finish("a")
    plan = s.plan({"b": 9.0, "c": 0.0}, 1.5)  # c takes the free row; nothing waits now
    assert plan.prefill == (("c", 0),) and plan.decode == (("c", 0),) and plan.held == (("b", 1),)


def test_a_stream_nobody_listens_to_goes_last_and_gives_its_row_to_one_somebody_does():
    s = Scheduler(max_running=4, max_prefills_per_step=4)  # a..d in rows 0..3: full
    for name in "abcd":
        s.add(name)
    s.plan()
    lead = 1.5
    # Held while a stream somebody listens to is due, however starved its own clock looks.
    plan = s.plan({"a": 0.0, "b": -5.0, "c": 0.0, "d": 0.0}, lead, absent={"b"})
    assert plan.held == (("b", 1),) and plan.preempted == ()
    # Nobody else due: spare capacity, it moves (voicing into its replay buffer).
    plan = s.plan({"a": 9.0, "b": -5.0, "c": 9.0, "d": 9.0}, lead, absent={"b"})
    assert plan.held == () and len(plan.decode) == 4
    # A stream somebody listens to waits for a row: the absent one admitted last gives its row up.
    s.add("e")
    plan = s.plan(None, lead, absent={"b", "c"})
    assert plan.preempted == (("c", 2),) and plan.prefill == (("e", 2),)
    assert s.running == 4 and s.waiting == 0 and "c" not in [i for i, _ in plan.decode]
    # Absent streams waiting take no row from anyone, and nobody gives a row to them.
    s.add("f")
    plan = s.plan(None, lead, absent={"b", "f"})
    assert plan.preempted == () and plan.prefill == () and s.waiting == 1
    # Two listeners waiting, one absent stream running: one row is taken, one still waits.
    s.add("g")
    s.add("h")
    plan = s.plan(None, lead, absent={"b", "f"})
    assert plan.preempted == (("b", 1),) and [i for i, _ in plan.prefill] == ["g"] and s.waiting == 2
    assert s.position("f") == 0 and s.position("h") == 1  # admitted listeners first; the queue's order kept
    s.add("i", priority=5)
    assert s.position("i") == 0


def test_an_absent_stream_waiting_for_a_row_does_not_switch_the_holds_off():
    s = Scheduler(max_running=2, max_prefills_per_step=2)
    for name in "ab":
        s.add(name)
    s.plan()
    s.add("x")  # a dropped session's segment: it waits behind everyone, and nobody runs on for it
    plan = s.plan({"a": 0.0, "b": 9.0}, 1.5, stalled=(), absent={"x"})
    assert plan.held == (("b", 1),) and plan.preempted == () and s.waiting == 1
    plan = s.plan({"a": 0.0, "b": 0.0}, 1.5, stalled={"b"}, absent={"x"})
    assert plan.held == (("b", 1),)  # its reader is behind: held, as if nothing waited
