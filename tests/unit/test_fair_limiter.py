"""FairLimiter, scripted: requests arrive, finish, give up and time out in a stated order,
and the test asserts who is served in which order. The event loop is driven explicitly and
its clock moves only when the script says (no sleeps, no real time)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from voxgate.serving.fair import FairLimiter, Lease
from voxgate.types import Busy


class ScriptedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test advances it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now


class Script:
    """Named requests against one limiter; `served` is the order in which they got a slot."""

    def __init__(self, loop: ScriptedLoop, limiter: FairLimiter) -> None:
        self.loop, self.limiter = loop, limiter
        self.served: list[str] = []
        self.refused: list[str] = []
        self.leases: dict[str, Lease] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def request(self, client: str, name: str) -> None:
        self.tasks[name] = self.loop.create_task(self._get(client, name))
        self.settle()

    def requests(self, client: str, names: str) -> None:
        for name in names.split():
            self.request(client, name)

    def finish(self, name: str) -> None:
        self.leases.pop(name).release()
        self.settle()

    def finish_in_turn(self) -> None:
        """Each request finishes as soon as it is served, until none is left."""
        while self.leases:
            self.finish(next(iter(self.leases)))

    def give_up(self, name: str) -> None:
        self.tasks[name].cancel()
        self.settle()

    def advance(self, seconds: float) -> None:
        self.loop.now += seconds
        self.settle()

    def settle(self) -> None:
        """Run everything that is ready now (callbacks chain a few steps deep at most)."""

        async def turns() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())

    async def _get(self, client: str, name: str) -> None:
        try:
            lease = await self.limiter.acquire(client)
        except Busy:
            self.refused.append(name)
            return
        self.served.append(name)
        self.leases[name] = lease


@pytest.fixture
def loop() -> Iterator[ScriptedLoop]:
    loop = ScriptedLoop()
    yield loop
    loop.close()


def script(loop: ScriptedLoop, active: int = 1, per_client: int = 1, waiting: int = 32, timeout_s: float = 30.0):
    return Script(loop, FairLimiter(active, per_client, waiting, timeout_s))


def test_a_flooding_client_cannot_push_another_clients_single_request_back(loop):
    s = script(loop)
    s.requests("A", "a1 a2 a3 a4 a5")
    s.request("B", "b1")
    assert s.served == ["a1"] and s.limiter.waiting == 5
    s.finish_in_turn()
    assert s.served == ["a1", "b1", "a2", "a3", "a4", "a5"]  # B second, not sixth
    assert s.limiter.active == 0 and s.limiter.waiting == 0


def test_waiting_clients_take_turns_round_robin(loop):
    s = script(loop)
    s.requests("A", "a1 a2 a3")
    s.requests("B", "b1 b2 b3")
    s.requests("C", "c1 c2 c3")
    s.finish_in_turn()
    assert s.served == ["a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"]


def test_a_client_never_holds_more_than_its_share_even_with_slots_free(loop):
    s = script(loop, active=4, per_client=2)
    s.requests("A", "a1 a2 a3 a4")
    assert s.served == ["a1", "a2"] and s.limiter.active_for("A") == 2 and s.limiter.waiting == 2
    s.requests("B", "b1 b2")
    assert s.served == ["a1", "a2", "b1", "b2"]  # the free slots went to B at once
    s.finish("b1")
    assert s.served == ["a1", "a2", "b1", "b2"] and s.limiter.active == 3  # A is still at its share
    s.finish("a1")
    assert s.served[-1] == "a3" and s.limiter.active_for("A") == 2


def test_a_waiter_that_gives_up_leaves_the_queue_at_once(loop):
    s = script(loop)
    s.request("A", "a1")
    s.requests("B", "b1")
    s.requests("C", "c1")
    s.give_up("b1")
    assert s.limiter.waiting == 1
    s.finish("a1")
    assert s.served == ["a1", "c1"] and s.tasks["b1"].cancelled()
    s.finish("c1")
    assert s.limiter.active == 0 and s.limiter.waiting == 0


def test_a_waiter_cancelled_just_after_its_grant_passes_the_slot_on(loop):
    s = script(loop)
    s.request("A", "a1")
    s.requests("B", "b1")
    s.requests("C", "c1")
    s.leases.pop("a1").release()  # b1 is granted, but its task has not run yet...
    s.tasks["b1"].cancel()  # ...when its client leaves
    s.settle()
    assert s.served == ["a1", "c1"] and s.limiter.active == 1 and s.limiter.active_for("B") == 0


def test_a_waiter_is_told_busy_after_the_queue_timeout_and_leaves_the_queue(loop):
    s = script(loop, timeout_s=30.0)
    s.request("A", "a1")
    s.request("B", "b1")
    s.advance(29.0)
    assert s.refused == [] and s.limiter.waiting == 1
    s.advance(2.0)
    assert s.refused == ["b1"] and s.limiter.waiting == 0
    s.finish("a1")
    assert s.limiter.active == 0  # the slot was not handed to the waiter that timed out


def test_a_full_queue_refuses_the_flood_not_the_client_beside_it(loop):
    s = script(loop, waiting=3)
    s.requests("A", "a1 a2 a3 a4")
    s.request("A", "a5")
    assert s.refused == ["a5"]  # full, and A already has the most waiting
    s.request("B", "b1")
    assert s.refused == ["a5", "a4"] and s.limiter.waiting == 3  # A's newest made room for B
    s.finish_in_turn()
    assert s.served == ["a1", "b1", "a2", "a3"]


def test_with_no_waiting_room_a_request_without_a_slot_is_busy_at_once(loop):
    s = script(loop, waiting=0)
    s.request("A", "a1")
    s.request("B", "b1")
    assert s.served == ["a1"] and s.refused == ["b1"]


def test_a_lease_frees_one_slot_however_often_it_is_released(loop):
    s = script(loop, active=2, per_client=2)
    s.requests("A", "a1 a2")
    s.request("B", "b1")
    lease = s.leases.pop("a1")
    lease.release()
    lease.release()
    s.settle()
    assert s.served == ["a1", "a2", "b1"] and s.limiter.active == 2 and not lease.held


def test_the_slot_context_releases_when_the_block_fails(loop):
    limiter = FairLimiter(1, 1, 4, 30.0)

    async def fail_inside() -> None:
        async with limiter.slot("A"):
            assert limiter.active == 1
            raise RuntimeError("the stream broke")

    with pytest.raises(RuntimeError):
        loop.run_until_complete(fail_inside())
    assert limiter.active == 0


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        FairLimiter(0, 1, 1, 1.0)
