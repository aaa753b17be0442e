"""The wake-up futures that waiters park on: woken or timed out, and which."""

from __future__ import annotations

import asyncio
import time

from tenure._aio import settle, woken_within
from tenure.stores._waiters import Wakeups


async def test_a_wake_up_reads_woken() -> None:
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, settle, future)
    start = time.monotonic()
    assert await woken_within(future, 5.0) is True
    assert time.monotonic() - start < 4.0


async def test_a_timeout_reads_timed_out() -> None:
    future = asyncio.get_running_loop().create_future()
    start = time.monotonic()
    assert await woken_within(future, 0.05) is False
    assert time.monotonic() - start >= 0.05
    assert future.done()


async def test_a_wake_up_before_the_wait_reads_woken() -> None:
    future = asyncio.get_running_loop().create_future()
    settle(future)
    assert await woken_within(future, 0.0) is True


async def test_a_wake_up_that_lands_beside_the_timer_reads_woken() -> None:
    """Woken and timed out in the same turn of the loop: the wake-up came first."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    waiting = asyncio.ensure_future(woken_within(future, 0.0))
    await asyncio.sleep(0)  # the waiter parks and its timer is due
    settle(future)
    assert await waiting is True


async def test_a_counted_waiter_hears_every_wake_up_that_came_while_it_was_awake() -> None:
    """Two releases heard in one turn of the loop are two, not one, for a
    waiter that counts them; a waiter that does not count hears one."""
    wakeups: Wakeups[str] = Wakeups()
    counted = wakeups.add("s", counted=True)
    plain = wakeups.add("s")
    wakeups.wake("s")
    wakeups.wake("s")
    assert counted.done() and plain.done()
    counted = wakeups.add("s", instead_of=counted, counted=True)
    plain = wakeups.add("s", instead_of=plain)
    assert counted.done(), "the second wake-up was kept for the counting waiter"
    assert not plain.done()
    counted = wakeups.add("s", instead_of=counted, counted=True)
    assert not counted.done(), "and only that one"
    wakeups.remove("s", counted)
    wakeups.remove("s", plain)
    assert "s" not in wakeups and len(wakeups) == 0
