"""Many waiters for one name: a line, served in the order it formed, one wake-up per release.

Counts, never times. Each waiter is confirmed in line before the next one
comes; their fencing tokens must then rise in that order, and the store must
have been waited on once per release (the first in line waits on it, the
rest wait their turn in the process), not once per waiter per release.
"""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from tenure import InvalidArgument, LockService, WaitQueueFull
from tenure import sync as tsync

from ..helpers.until import until, until_blocking

WAITERS = 40


def _count_is(locks: tsync.LockService, count: int) -> bool:
    return locks.waiting("sync-line") == count


async def _in_line(locks: LockService, name: str, count: int) -> None:
    await until(lambda: locks.waiting(name) == count, f"{count} waiters in line for {name!r}")


async def test_waiters_are_served_in_the_order_they_came(url: str) -> None:
    async with LockService.from_url(url) as locks:
        first = await locks.acquire("herd", ttl=30)
        assert first is not None
        order: list[int] = []

        async def waiter(k: int) -> int:
            lock = await locks.acquire("herd", ttl=30, wait=60)
            assert lock is not None, f"waiter {k} timed out"
            order.append(k)
            await lock.release()
            return lock.fencing_token

        tasks = []
        for k in range(WAITERS):
            tasks.append(asyncio.ensure_future(waiter(k)))
            await _in_line(locks, "herd", k + 1)
        before = locks._line.store_waits
        await first.release()
        fences = await asyncio.gather(*tasks)
        assert order == list(range(WAITERS))
        assert fences == sorted(fences) and len(set(fences)) == WAITERS
        assert fences[0] > first.fencing_token
        # The first in line was waiting on the store before the release (one
        # wait counted already); each release after woke one waiter.
        woken = locks._line.store_waits - before
        assert woken == WAITERS - 1, f"{woken} waits on the store for {WAITERS} releases"
        assert locks.waiting("herd") == 0


async def test_a_waiter_that_gives_up_leaves_the_line_to_the_next(url: str) -> None:
    async with LockService.from_url(url) as locks:
        first = await locks.acquire("giving-up", ttl=30)
        assert first is not None
        head = asyncio.ensure_future(locks.acquire("giving-up", ttl=30, wait=60))
        await until(lambda: locks.waiting("giving-up") == 1, "head in line")
        middle = asyncio.ensure_future(locks.acquire("giving-up", ttl=30, wait=60))
        await until(lambda: locks.waiting("giving-up") == 2, "middle in line")
        brief = asyncio.ensure_future(locks.acquire("giving-up", ttl=30, wait=0.2))
        last = asyncio.ensure_future(locks.acquire("giving-up", ttl=30, wait=60))
        await until(lambda: locks.waiting("giving-up") == 4, "all in line")
        assert await brief is None  # timed out in line, and left it
        head.cancel()
        with pytest.raises(asyncio.CancelledError):
            await head
        assert locks.waiting("giving-up") == 2
        await first.release()
        got = await middle
        assert got is not None
        await got.release()
        got = await last
        assert got is not None
        await got.release()
        assert locks.waiting("giving-up") == 0


async def test_a_line_past_its_bound_refuses_the_next_waiter(url: str) -> None:
    async with LockService.from_url(url, waiters=2) as locks:
        first = await locks.acquire("bounded", ttl=30)
        assert first is not None
        queued = []
        for k in range(2):
            queued.append(asyncio.ensure_future(locks.acquire("bounded", ttl=30, wait=60)))
            await _in_line(locks, "bounded", k + 1)
        with pytest.raises(WaitQueueFull, match=r"waiters=2"):
            await locks.acquire("bounded", ttl=30, wait=60)
        assert await locks.acquire("bounded", ttl=30) is None  # wait=0 never queues
        assert locks.waiting("bounded") == 2
        await first.release()
        for task in queued:
            lock = await task
            assert lock is not None
            await lock.release()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True, None])
def test_bad_waiter_bounds_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="waiters must be a whole number"):
        LockService.from_url("memory://", waiters=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="waiters must be a whole number"):
        tsync.LockService.from_url("memory://", waiters=bad)  # type: ignore[arg-type]


def test_blocking_callers_wait_in_the_same_line(url: str) -> None:
    with tsync.LockService.from_url(url) as locks:
        first = locks.acquire("sync-line", ttl=30)
        assert first is not None
        results: list[int] = []

        def waiter() -> None:
            lock = locks.acquire("sync-line", ttl=30, wait=60)
            assert lock is not None
            results.append(lock.fencing_token)
            lock.release()

        threads = [threading.Thread(target=waiter) for _ in range(8)]
        for count, thread in enumerate(threads, 1):
            thread.start()
            until_blocking(functools.partial(_count_is, locks, count), f"{count} threads in line")
        first.release()
        for thread in threads:
            thread.join(60)
        assert results == sorted(results) and len(results) == 8
