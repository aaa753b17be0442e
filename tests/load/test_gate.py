"""The bound on calls in flight (stores._gate): order, timeouts, threads and loops together."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tenure.errors import StoreUnavailable
from tenure.stores._gate import Gate


async def test_callers_past_the_bound_queue_and_go_in_arrival_order() -> None:
    gate = Gate(2, 5.0, what="test store")
    order: list[int] = []
    release = asyncio.Event()

    async def call(i: int) -> None:
        async with gate:
            order.append(i)
            await release.wait()

    tasks = []
    for i in range(6):
        tasks.append(asyncio.ensure_future(call(i)))
        await asyncio.sleep(0)  # each registered before the next
    await asyncio.sleep(0.01)
    assert order == [0, 1], "only two in flight"
    assert gate.in_flight == 2 and gate.queued == 4
    release.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4, 5]
    assert gate.in_flight == 0 and gate.peak == 2


async def test_a_full_gate_past_its_timeout_names_the_bound_and_the_option() -> None:
    gate = Gate(1, 0.2, what="PostgreSQL at postgresql://u:***@h/db")
    async with gate:
        with pytest.raises(StoreUnavailable) as caught:
            async with gate:
                pass
    message = str(caught.value)
    assert "all 1 connections stayed busy for 0.2 s" in message
    assert "pool_max=1" in message and "raise pool_max" in message
    # The timed-out caller left nothing behind: the next one goes at once.
    assert gate.in_flight == 0
    async with asyncio.timeout(0.1), gate:
        assert gate.in_flight == 1


async def test_a_cancelled_caller_passes_a_turn_it_was_given_on() -> None:
    gate = Gate(1, 5.0, what="test store")
    await gate.__aenter__()
    second = asyncio.ensure_future(gate.__aenter__())
    third = asyncio.ensure_future(gate.__aenter__())
    await asyncio.sleep(0.01)
    gate.leave()  # the turn goes to the second caller ...
    second.cancel()  # ... which is cancelled before it runs: the third gets it
    await asyncio.sleep(0.01)
    assert third.done() and not third.cancelled()
    assert gate.in_flight == 1
    gate.leave()
    assert gate.in_flight == 0


def test_threads_and_event_loops_share_one_bound() -> None:
    gate = Gate(3, 10.0, what="test store")
    inside = 0
    most = 0
    guard = threading.Lock()

    def enter_leave() -> None:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.002)
        with guard:
            inside -= 1

    def blocking_caller() -> None:
        for _ in range(20):
            with gate.blocking():
                enter_leave()

    def loop_caller() -> None:
        async def many() -> None:
            async def one() -> None:
                async with gate:
                    enter_leave()
                    await asyncio.sleep(0)

            await asyncio.gather(*(one() for _ in range(40)))

        asyncio.run(many())

    threads = [threading.Thread(target=blocking_caller) for _ in range(8)]
    threads += [threading.Thread(target=loop_caller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 3, "the bound was reached and never passed"
    assert gate.queued > 0 and gate.peak == 3 and gate.in_flight == 0


def test_a_blocking_caller_times_out_with_the_same_error() -> None:
    gate = Gate(1, 0.1, what="Redis at redis://h/0")
    gate.enter_blocking()
    with pytest.raises(StoreUnavailable, match=r"pool_max=1"):
        gate.enter_blocking()
    gate.leave()
    with gate.blocking():
        assert gate.in_flight == 1
