"""A semaphore release reaches the first waiter, not the ones behind it: every
store whose change feed counts a waiter's turn (all but the memory store)."""

from __future__ import annotations

import asyncio

from tenure import LockService
from tenure.stores.base import Grant
from tenure.stores.semaphores import Queued


async def release_reaches_only_the_first(locks: LockService) -> None:
    """By order, not time: the first waiter's wait returns on the holder's
    release while the second's goes on, until the first has had its turn."""
    permits = locks.store.semaphores
    holder = await locks.semaphore("turns", 1).acquire(ttl=30)
    assert holder is not None
    places = []
    for token in ("first", "second"):
        answer = await permits.acquire("turns", token, 30, "h", 1, queue=30)
        assert isinstance(answer, Queued)
        places.append(answer.ahead)
    assert places == [0, 1]
    async with permits.changes("turns") as first, permits.changes("turns") as second:
        for changes, token, ahead in ((first, "first", 0), (second, "second", 1)):
            changes.follow(token)
            changes.queued(ahead)  # as the waiter's own acquire loop does
        first_woken = asyncio.ensure_future(first.wait(10))
        second_woken = asyncio.ensure_future(second.wait(10))
        await asyncio.sleep(0.1)  # neither can be granted yet
        assert not first_woken.done() and not second_woken.done()
        await holder.release()
        await asyncio.wait_for(first_woken, 5)
        assert not second_woken.done(), "a release woke a waiter it could not reach"
        granted = await permits.acquire("turns", "first", 30, "h", 1, queue=30)
        assert isinstance(granted, Grant)
        await asyncio.sleep(0.1)
        assert not second_woken.done(), "the first's grant is not the second's turn"
        assert await permits.release("turns", "first")
        await asyncio.wait_for(second_woken, 5)
    # Its turn came: its acquire would be granted now.
    assert isinstance(await permits.acquire("turns", "second", 30, "h", 1, queue=30), Grant)
    assert await permits.release("turns", "second")
