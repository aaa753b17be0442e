"""The semaphore contract, run over every store and both APIs.

At most ``limit`` permits at once by the store's clock; each permit has the
Lock surface and is renewed by the service's renewer; release is
compare-and-set; a crashed holder's permit frees within its TTL; waiters are
served in the order they queued, across services; the limit is part of the
live state; semaphores have a namespace of their own.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import tenure
from tenure import InvalidArgument, LimitMismatch, LockService, Outcome
from tenure.lease import LOST_BY_STORE

from ..helpers.lapse import lapse
from ..helpers.procs import Worker
from ..helpers.semaphore_turns import release_reaches_only_the_first
from ..helpers.sync_as_async import ServiceOverSync

TTL = 1.0


@pytest.fixture(params=["asyncio", "sync"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _service(api: str, url: str) -> Any:
    service = LockService.from_url(url) if api == "asyncio" else ServiceOverSync(url)
    return await service.__aenter__()


@pytest.fixture
async def locks(api: str, url: str) -> AsyncIterator[Any]:
    service = await _service(api, url)
    yield service
    await service.__aexit__(None, None, None)


@pytest.fixture
async def other(api: str, url: str) -> AsyncIterator[Any]:
    service = await _service(api, url)
    yield service
    await service.__aexit__(None, None, None)


async def test_at_most_limit_permits_with_rising_fencing_tokens(locks: Any, other: Any) -> None:
    mine, theirs = locks.semaphore("pool", 3), other.semaphore("pool", 3)
    granted = [
        await mine.acquire(ttl=TTL),
        await theirs.acquire(ttl=TTL),
        await mine.acquire(ttl=TTL),
    ]
    assert all(p is not None and p.held for p in granted)
    assert await theirs.acquire(ttl=TTL) is None
    assert await mine.acquire(ttl=TTL) is None
    fences = [p.fencing_token for p in granted]
    assert fences == sorted(fences) and len(set(fences)) == 3
    state = await mine.state()
    assert state.limit == 3 and len(state.permits) == 3 and state.waiting == 0
    assert all(not hasattr(info, "token") for info in state.permits)
    assert await granted[1].release() is True
    again = await theirs.acquire(ttl=TTL)
    assert again is not None and again.fencing_token > max(fences)
    for permit in (*granted, again):
        await permit.release()
    assert (await mine.state()).permits == []


async def test_release_is_compare_and_set(locks: Any) -> None:
    semaphore = locks.semaphore("cas", 1)
    permit = await semaphore.acquire(ttl=TTL)
    assert permit is not None
    assert await permit.release() is True
    assert await permit.release() is False  # twice: nothing sent, nothing changed
    newer = await semaphore.acquire(ttl=TTL)
    assert newer is not None
    # The first permit's token, replayed straight at the store, is stale.
    store = locks.store
    assert await store.semaphores.release("cas", permit.token) is False
    assert newer.held and len((await semaphore.state()).permits) == 1
    await newer.release()


async def test_permits_are_renewed_past_many_ttls(locks: Any) -> None:
    permit = await locks.semaphore("long", 1).acquire(ttl=TTL)
    assert permit is not None
    trips = locks.renewer.round_trips
    await asyncio.sleep(3 * TTL)
    assert permit.held and not permit.lost
    assert locks.renewer.round_trips >= trips + 3
    assert await locks.semaphore("long", 1).acquire(ttl=TTL) is None
    assert await permit.release() is True


async def test_a_permit_gone_from_the_store_is_lost(locks: Any) -> None:
    permit = await locks.semaphore("vanish", 2).acquire(ttl=TTL)
    assert permit is not None
    assert await locks.store.semaphores.release("vanish", permit.token) is True
    await asyncio.wait_for(permit.wait_lost(), 2 * TTL)
    assert permit.lost and permit.lost_reason == LOST_BY_STORE
    assert await permit.release() is False


async def test_a_crashed_holders_permit_frees_within_its_ttl(locks: Any) -> None:
    store = locks.store.semaphores
    grant = await store.acquire("crash", "d" * 32, 0.6, "dead:1:x", 1, queue=0)
    assert isinstance(grant, tenure.stores.base.Grant)
    semaphore = locks.semaphore("crash", 1)
    assert await semaphore.acquire(ttl=TTL) is None  # the fault: a live, unrenewed permit
    start = time.monotonic()
    permit = await semaphore.acquire(ttl=TTL, wait=10)
    assert permit is not None and permit.fencing_token > grant.fencing_token
    assert time.monotonic() - start < lapse(locks.store, 0.6) + 1.0
    await permit.release()


async def test_waiters_are_served_in_the_order_they_queued(locks: Any, other: Any) -> None:
    holder = await locks.semaphore("line", 1).acquire(ttl=TTL)
    assert holder is not None
    order: list[str] = []
    permits: dict[str, Any] = {}

    async def wait(service: Any, label: str) -> None:
        permit = await service.semaphore("line", 1).acquire(ttl=TTL, wait=15)
        assert permit is not None
        order.append(label)
        permits[label] = permit

    waiters = []
    for i, service in enumerate((other, locks, other)):
        waiters.append(asyncio.ensure_future(wait(service, f"w{i}")))
        # Each confirmed queued before the next one registers.
        for _ in range(100):
            if (await locks.semaphore("line", 1).state()).waiting == i + 1:
                break
            await asyncio.sleep(0.02)
        assert (await locks.semaphore("line", 1).state()).waiting == i + 1
    await holder.release()
    for label in ("w0", "w1", "w2"):
        for _ in range(250):
            if label in permits:
                break
            await asyncio.sleep(0.02)
        assert order[-1] == label
        await permits[label].release()
    await asyncio.gather(*waiters)
    assert order == ["w0", "w1", "w2"]
    fences = [permits[label].fencing_token for label in order]
    assert fences == sorted(fences) and fences[0] > holder.fencing_token


async def test_a_release_in_another_process_wakes_a_waiter_at_once(shared_url: str) -> None:
    """The store's own notification (not the waiter's next call) brings the
    news: ``changes().wait`` is given far longer than the test waits."""
    holder = Worker(shared_url)
    try:
        assert holder.ask(f"permit woken 1 {10 * TTL}")["ok"]
        async with LockService.from_url(shared_url) as locks:
            store, token = locks.store.semaphores, uuid.uuid4().hex
            async with store.changes("woken") as changes:
                # Queued, as a waiting acquire is (its entry lives 30 s here).
                queued = await store.acquire("woken", token, TTL, locks.holder, 1, queue=30)
                assert queued == tenure.stores.semaphores.Queued(0)
                assert holder.ask("release")["released"] is True
                await asyncio.wait_for(changes.wait(3600), 10)
            granted = await store.acquire("woken", token, TTL, locks.holder, 1, queue=30)
            assert isinstance(granted, tenure.stores.base.Grant)
            assert await store.release("woken", token) is True
    finally:
        holder.close()


async def test_a_release_wakes_the_waiter_it_reaches_not_the_ones_behind(shared_url: str) -> None:
    """A waiter counts the releases it hears against its place in the queue, so
    that n waiters cost n handoffs, not n²."""
    async with LockService.from_url(shared_url) as locks:
        await release_reaches_only_the_first(locks)


async def test_a_waiter_times_out_with_none_and_leaves_the_queue(locks: Any) -> None:
    semaphore = locks.semaphore("busy", 1)
    holder = await semaphore.acquire(ttl=TTL)
    assert holder is not None
    start = time.monotonic()
    assert await semaphore.acquire(ttl=TTL, wait=0.4) is None
    assert 0.35 < time.monotonic() - start < 3
    assert (await semaphore.state()).waiting == 0
    await holder.release()


async def test_the_limit_is_live_state_until_the_semaphore_is_idle(locks: Any, other: Any) -> None:
    permit = await locks.semaphore("deploy", 2).acquire(ttl=TTL)
    assert permit is not None
    with pytest.raises(LimitMismatch) as caught:
        await other.semaphore("deploy", 5).acquire(ttl=TTL)
    assert caught.value.live == 2 and caught.value.asked == 5
    assert "2" in str(caught.value) and "5" in str(caught.value)
    state = await locks.semaphore("deploy", 2).state()
    assert state.limit == 2 and len(state.permits) == 1  # nothing changed
    await permit.release()
    assert (await locks.semaphore("deploy", 2).state()).limit is None  # idle
    raised = [await other.semaphore("deploy", 5).acquire(ttl=TTL) for _ in range(5)]
    assert all(raised) and await other.semaphore("deploy", 5).acquire(ttl=TTL) is None
    for p in raised:
        await p.release()


async def test_locks_and_semaphores_do_not_meet(locks: Any) -> None:
    lock = await locks.acquire("shared-name", ttl=TTL)
    permit = await locks.semaphore("shared-name", 1).acquire(ttl=TTL)
    assert lock is not None and permit is not None
    assert [i.name for i in await locks.store.holders("shared-name")] == ["shared-name"]
    await permit.release()
    assert lock.held
    await lock.release()


async def test_run_exclusively_runs_under_a_permit_or_skips(locks: Any) -> None:
    semaphore = locks.semaphore("jobs", 1)
    ran: list[int] = []
    assert await semaphore.run_exclusively(ran.append, 1, ttl=TTL) == Outcome.RAN
    holder = await semaphore.acquire(ttl=TTL)
    assert await semaphore.run_exclusively(ran.append, 2, ttl=TTL) == Outcome.SKIPPED
    await holder.release()
    assert ran == [1]
    assert (await semaphore.state()).permits == []


@pytest.fixture
async def on_memory(api: str) -> AsyncIterator[Any]:
    """A service on the memory store: argument checks need no other."""
    service = await _service(api, f"memory://semaphores-{uuid.uuid4().hex}")
    yield service
    await service.__aexit__(None, None, None)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "2", None])
async def test_a_bad_limit_is_refused_before_anything_is_sent(on_memory: Any, limit: Any) -> None:
    with pytest.raises(InvalidArgument, match="limit"):
        on_memory.semaphore("bad", limit)


@pytest.mark.parametrize(
    ("ttl", "wait"), [(0.1, 0.0), (math.inf, 0.0), (1.0, -1.0), (1.0, math.nan), ("1", 0.0)]
)
async def test_bad_ttl_or_wait_is_refused(on_memory: Any, ttl: Any, wait: Any) -> None:
    with pytest.raises(InvalidArgument):
        await on_memory.semaphore("bad", 1).acquire(ttl=ttl, wait=wait)
    assert (await on_memory.semaphore("bad", 1).state()).limit is None
