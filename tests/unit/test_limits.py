"""Stream slots waited for in turn, sessions per client (speech/limits.py), the message-rate bucket
(serving/limits.py)."""

from __future__ import annotations

import asyncio

import pytest

from voxgate.serving.limits import MessageRate, Turn
from voxgate.speech.limits import SessionCounter, StreamLimiter
from voxgate.types import Busy, TooManySessions, TooManyStreams


def _run(coro):
    return asyncio.run(coro)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_acquire_refuses_at_the_client_and_server_limits():
    limiter = StreamLimiter(max_streams=3, max_per_client=2)
    limiter.acquire("a")
    limiter.acquire("a")
    with pytest.raises(TooManyStreams):
        limiter.acquire("a")
    limiter.acquire("b")
    with pytest.raises(Busy):
        limiter.acquire("c")
    assert limiter.active == 3


def test_waiters_are_served_in_turn_and_a_client_at_its_cap_blocks_no_one():
    async def run() -> list[str]:
        limiter = StreamLimiter(max_streams=2, max_per_client=1)
        order: list[str] = []

        async def take(client: str, name: str) -> None:
            await limiter.wait(client)
            order.append(name)

        await limiter.wait("a")  # a holds its one slot
        tasks = [asyncio.create_task(take(c, n)) for c, n in (("a", "a2"), ("a", "a3"), ("b", "b1"))]
        await _settle()
        assert order == ["b1"]  # a2 and a3 wait for a's slot; b is not held up behind them
        limiter.release("b")
        await _settle()
        assert order == ["b1"] and limiter.waiting == 2  # b's slot cannot go to a (at its cap)
        limiter.release("a")
        await _settle()
        limiter.release("a")
        await _settle()
        await asyncio.gather(*tasks)
        return order

    assert _run(run()) == ["b1", "a2", "a3"]


def test_a_cancelled_wait_leaves_the_queue_and_gives_back_a_slot_granted_meanwhile():
    async def run() -> None:
        limiter = StreamLimiter(max_streams=1, max_per_client=1)
        await limiter.wait("a")
        waiting = asyncio.create_task(limiter.wait("b"))
        await _settle()
        waiting.cancel()
        await _settle()
        assert limiter.waiting == 0
        granted = asyncio.create_task(limiter.wait("b"))
        await _settle()
        limiter.release("a")  # grants b ...
        granted.cancel()  # ... just as its wait is cancelled
        with pytest.raises(asyncio.CancelledError):
            await granted
        assert limiter.active == 0  # the slot came back

    _run(run())


def test_the_engine_capacity_bounds_admission_and_may_change_while_serving():
    async def run() -> None:
        capacity: list[int | None] = [None]
        limiter = StreamLimiter(max_streams=4, max_per_client=4, capacity=lambda: capacity[0])
        assert limiter.limit == 4  # the engine cannot say: the configured limit alone
        capacity[0] = 2
        assert limiter.limit == 2
        limiter.acquire("a")
        limiter.acquire("b")
        with pytest.raises(Busy, match="2 streams in real time"):
            limiter.acquire("c")
        with pytest.raises(Busy, match="2 streams in real time"):
            limiter.open_session()
        capacity[0] = 1  # the engine measured itself slower: what is in keeps going ...
        assert limiter.active == 2
        limiter.release("a")
        with pytest.raises(Busy):  # ... and nothing new comes in until the voices fall under it
            limiter.acquire("c")
        capacity[0] = 9  # faster than configured: max_streams still bounds
        assert limiter.limit == 4
        limiter.acquire("c")
        limiter.open_session()
        assert limiter.voices == 3

    _run(run())


def test_voices_stay_within_the_slots_shown_when_the_engine_could_do_more():
    limiter = StreamLimiter(max_streams=2, max_per_client=8, capacity=lambda: 9)
    assert limiter.limit == 2  # what voxgate_stream_slots shows
    limiter.open_session()
    limiter.open_session()
    with pytest.raises(Busy, match="limit of 2"):
        limiter.open_session()
    assert limiter.voices == 2


def test_with_no_capacity_known_a_session_is_refused_only_when_the_slots_are_full_and_others_wait():
    async def run() -> None:
        limiter = StreamLimiter(max_streams=1, max_per_client=4, capacity=lambda: None)
        limiter.open_session()  # free slots: in
        limiter.acquire("a")
        limiter.open_session()  # full, but nobody waits yet: the newcomer will be first in line
        waiting = asyncio.create_task(limiter.wait("b"))
        await _settle()
        with pytest.raises(Busy, match="limit of 1"):
            limiter.open_session()
        assert limiter.sessions == 2
        limiter.release("a")
        await _settle()
        assert waiting.done()
        limiter.open_session()  # nobody waits any more
        assert limiter.sessions == 3

    _run(run())


def test_a_known_capacity_bounds_sessions_plus_standalone_streams():
    async def run() -> None:
        limiter = StreamLimiter(max_streams=8, max_per_client=8, capacity=lambda: 3)
        limiter.open_session()
        limiter.open_session()
        limiter.acquire("http")  # the third voice
        assert limiter.voices == 3
        with pytest.raises(Busy, match="3 streams in real time"):
            limiter.open_session()
        with pytest.raises(Busy, match="3 streams in real time"):
            limiter.acquire("http")
        await limiter.wait("ws")  # an open session's segment: its voice is reserved, so it gets a slot
        await limiter.wait("ws")
        assert limiter.active == 3 and limiter.voices == 3
        limiter.release("ws", in_session=True)
        limiter.release("ws", in_session=True)
        limiter.close_session()
        assert limiter.voices == 2
        limiter.acquire("http")
        limiter.release("http")
        limiter.release("http")
        assert limiter.voices == 1 and limiter.active == 0

    _run(run())


def test_sessions_are_counted_per_client():
    sessions = SessionCounter(max_per_client=2)
    sessions.open("a")
    sessions.open("a")
    with pytest.raises(TooManySessions):
        sessions.open("a")
    sessions.open("b")
    sessions.close("a")
    sessions.open("a")
    assert sessions.held("a") == 2 and sessions.held("b") == 1


def test_the_message_rate_allows_a_burst_then_the_sustained_rate():
    rate = MessageRate(per_s=10, burst=5)
    assert all(rate.take(0.0) for _ in range(5))
    assert not rate.take(0.0)
    assert rate.take(0.1) and not rate.take(0.1)  # one token per 0.1 s
    assert sum(rate.take(10.0) for _ in range(100)) == 5  # refills to the burst, no more


def test_a_big_message_costs_a_token_per_started_4_kib_and_a_full_bucket_takes_any():
    rate = MessageRate(per_s=10, burst=20)
    assert rate.take(0.0, 4096) and rate.take(0.0, 4097)  # 1 + 2 tokens
    assert rate.take(0.0, 60_000)  # 15 tokens: 2 left
    assert not rate.take(0.0, 8193) and rate.take(0.0, 8192) and not rate.take(0.0)
    big = MessageRate(per_s=1, burst=3)
    assert big.take(0.0, 1 << 20) and not big.take(0.0, 1)  # a message bigger than the burst empties the bucket


def test_a_turn_lets_other_tasks_run_once_its_budget_is_spent():
    async def other_ran(turn: Turn) -> bool:
        ran = []
        asyncio.get_running_loop().call_soon(ran.append, True)
        for _ in range(3):
            await turn.end()
        return bool(ran)

    assert _run(other_ran(Turn(budget_s=0.0)))  # spent at once: yields
    assert not _run(other_ran(Turn(budget_s=3600.0)))  # within its budget: the frames go on
