"""An async function under a lock runs in its caller's task (``locks/running.py``):
what a loss and a cancellation do to that task. Store-independent: the memory store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from tenure import LockLost, LockService, current_lock

TTL = 1.0


@pytest.fixture
async def locks() -> AsyncIterator[LockService]:
    async with LockService.from_url(f"memory://running-{uuid.uuid4().hex}") as service:
        yield service


async def _lose_current_lock(locks: LockService) -> None:
    lock = current_lock()
    await locks.store.release(lock.name, lock.token)  # the renewer finds it gone


async def test_the_function_runs_in_the_callers_task(locks: LockService) -> None:
    seen: list[asyncio.Task[object] | None] = []

    async def work() -> None:
        seen.append(asyncio.current_task())

    await locks.run_exclusively("same-task", work, ttl=TTL)
    assert seen == [asyncio.current_task()]


async def test_a_loss_raises_lock_lost_and_leaves_the_task_uncancelled(locks: LockService) -> None:
    async def long_work() -> None:
        await _lose_current_lock(locks)
        await asyncio.sleep(30)

    me = asyncio.current_task()
    assert me is not None
    with pytest.raises(LockLost):
        await locks.run_exclusively("lose", long_work, ttl=TTL)
    assert me.cancelling() == 0, "the cancellation that stopped the work is taken back"
    await asyncio.sleep(0.01)  # nothing is pending against this task


async def test_a_function_that_swallows_the_cancel_still_ends_in_lock_lost(
    locks: LockService,
) -> None:
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        await _lose_current_lock(locks)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            swallowed.set()  # and returns as if nothing happened

    me = asyncio.current_task()
    assert me is not None
    with pytest.raises(LockLost):
        await locks.run_exclusively("stubborn", stubborn, ttl=TTL)
    assert swallowed.is_set()
    assert me.cancelling() == 0


async def test_a_cancel_from_outside_stays_a_cancel(locks: LockService) -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    run = asyncio.ensure_future(locks.run_exclusively("outside", work, ttl=TTL))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await locks.store.holders("outside") == [], "released on the way out"


async def test_a_cancel_from_outside_after_a_loss_stays_a_cancel(locks: LockService) -> None:
    """The loss cancelled the work first; the caller's own cancel arriving while
    the work unwinds is not turned into LockLost."""
    unwinding = asyncio.Event()
    go_on = asyncio.Event()

    async def slow_to_unwind() -> None:
        await _lose_current_lock(locks)
        try:
            await asyncio.sleep(30)
        finally:
            unwinding.set()
            await asyncio.shield(go_on.wait())

    run = asyncio.ensure_future(locks.run_exclusively("both", slow_to_unwind, ttl=TTL))
    await unwinding.wait()
    run.cancel()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await run
