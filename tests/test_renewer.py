"""The renewer's bookkeeping: arrivals, wake-ups and what it keeps (memory store)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest

from tenure import LockService
from tenure.lease import LeaseState
from tenure.renewer import MAX_ARRIVALS, Renewer
from tenure.stores.memory import MemoryStore


@pytest.fixture
async def locks() -> AsyncIterator[LockService]:
    async with LockService(MemoryStore()) as service:
        yield service


async def test_a_shorter_ttl_arriving_while_the_renewer_sleeps_is_renewed(
    locks: LockService,
) -> None:
    long = await locks.acquire("long", ttl=30)
    assert long is not None
    for _ in range(100):  # until the renewer sleeps toward long's renewal, 10 s away
        if locks.renewer._next_wake > time.monotonic() + 5:
            break
        await asyncio.sleep(0.02)
    assert locks.renewer._next_wake > time.monotonic() + 5
    short = await locks.acquire("short", ttl=0.6)
    assert short is not None
    end = time.monotonic() + 1.5  # 2.5 TTLs: lost unless renewed about every 0.2 s
    while time.monotonic() < end:
        assert short.held
        await asyncio.sleep(0.05)
    assert locks.renewer.round_trips >= 5
    assert await short.release() is True


async def test_released_locks_neither_pile_up_nor_wake_the_renewer(
    locks: LockService, monkeypatch: pytest.MonkeyPatch
) -> None:
    pokes: list[int] = []
    poke = Renewer._poke_from_outside

    def counted(self: Renewer) -> None:
        pokes.append(1)
        poke(self)

    monkeypatch.setattr(Renewer, "_poke_from_outside", counted)
    cycles = 3 * MAX_ARRIVALS
    for _ in range(cycles):
        lock = await locks.acquire("churn")
        assert lock is not None
        assert await lock.release() is True
    renewer = locks.renewer
    # A wake-up at the first acquire, then one per MAX_ARRIVALS to let the
    # released ones go: never one per acquire.
    assert 1 <= len(pokes) <= cycles // MAX_ARRIVALS + 2, len(pokes)
    await asyncio.sleep(0.05)
    assert len(renewer._arrivals) <= MAX_ARRIVALS + 1
    # A lease released before the renewer looks never enters the heap; one that
    # was between its acquire and release when the renewer took its turn may.
    assert len(renewer._heap) <= cycles // MAX_ARRIVALS + 2, len(renewer._heap)
    assert all(entry[2].released for entry in renewer._heap)
    assert renewer.round_trips == 0


async def test_an_arrival_between_sorting_in_and_sleeping_is_not_overslept() -> None:
    """The race the lock-free add relies on: the renewer publishes its wake-up,
    then looks at the arrivals again; an early one makes it loop instead of sleep."""
    renewer = Renewer(MemoryStore())
    renewer._wake = asyncio.Event()
    guard = threading.Lock()
    now = time.monotonic()
    far = LeaseState("far", "t1", 30.0, now, guard)
    renewer._heap.append((far.renew_at, 0, far))
    early = LeaseState("early", "t2", 0.6, now, guard)
    sort_in = renewer._sort_in

    def sort_in_then_an_add_lands(at: float) -> None:
        sort_in(at)
        renewer._arrivals.append(early)  # an add that read the old _next_wake

    renewer._sort_in = sort_in_then_an_add_lands  # type: ignore[assignment,method-assign]
    batch, wake_at = renewer._settle(now)
    assert batch == []
    assert wake_at == now, "looks again at once, rather than sleeping toward 'far'"
    renewer._sort_in = sort_in  # type: ignore[method-assign]
    batch, wake_at = renewer._settle(now)
    assert wake_at == early.renew_at
