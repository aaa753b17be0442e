"""Many callers at once on every store: none fails because the pool is full.

Counts, never times. Each test shows that the load happened: every lock of
the burst held at the same moment, callers queued on the store's bound on
calls in flight (where it has one), threads waiting inside acquire together.
"""

from __future__ import annotations

import asyncio
import threading

from tenure import LockService
from tenure import sync as tsync

BURST = 500
THREADS = 200
CYCLES = 2000
NAMES = 50


def _as_deployed(url: str) -> str:
    """The store's own defaults: the tests' SQLite URL waits only 0.1 s for a
    busy database, so that its outage tests fail fast; under load a caller
    waits for the writer before it, as an application's would (2 s)."""
    return url.replace("busy_timeout=0.1", "busy_timeout=2")


async def test_a_burst_of_acquires_all_succeed(url: str) -> None:
    """500 acquires at once from one process, distinct names: each gets its lock."""
    async with LockService.from_url(_as_deployed(url)) as locks:
        all_held = asyncio.Event()
        held = 0
        most = 0

        async def one(i: int) -> int:
            nonlocal held, most
            lock = await locks.acquire(f"burst-{i}", ttl=10)
            assert lock is not None, f"burst-{i} was free, yet not granted"
            held += 1
            most = max(most, held)
            if held == BURST:
                all_held.set()
            async with asyncio.timeout(60):
                await all_held.wait()  # the work: every lock is held at once
            held -= 1
            assert await lock.release()
            return lock.fencing_token

        fences = await asyncio.gather(*(one(i) for i in range(BURST)))
        assert len(fences) == BURST and most == BURST
        gate = locks.store.gate
        if gate is not None:
            assert gate.queued > 0, "the burst never had to queue for a connection"
            assert gate.peak == gate.limit
        assert await locks.store.holders("burst-") == []


def test_threads_contending_all_succeed_without_overlap(url: str) -> None:
    """200 threads, 2,000 acquire(wait=30)+release over 50 names, through tenure.sync."""
    with tsync.LockService.from_url(_as_deployed(url)) as locks:
        owner: dict[str, int] = {}
        guard = threading.Lock()
        waiting = most_waiting = granted = 0
        overlaps: list[str] = []
        errors: list[BaseException] = []
        start = threading.Barrier(THREADS)
        per_thread = CYCLES // THREADS

        def work(k: int) -> None:
            nonlocal waiting, most_waiting, granted
            start.wait()
            for j in range(per_thread):
                name = f"herd-{(k * per_thread + j) % NAMES}"
                with guard:
                    waiting += 1
                    most_waiting = max(most_waiting, waiting)
                try:
                    lock = locks.acquire(name, ttl=10, wait=30)
                except BaseException as exc:
                    errors.append(exc)
                    return
                finally:
                    with guard:
                        waiting -= 1
                assert lock is not None
                with guard:
                    if name in owner:
                        overlaps.append(name)
                    owner[name] = k
                    granted += 1
                with guard:
                    del owner[name]
                try:
                    assert lock.release()
                except BaseException as exc:
                    errors.append(exc)
                    return

        threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert overlaps == []
        assert granted == CYCLES
        assert most_waiting >= 100, f"only {most_waiting} threads were ever in acquire at once"
