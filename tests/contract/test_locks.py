"""The lock contract C1-C9 and C11, run unchanged over every store and both APIs.

Each test runs on the asyncio API and on the blocking one (``tenure.sync``,
through tests/helpers/sync_as_async.py); the few that are about asyncio itself
(async functions, task cancellation) are marked ``asyncio_only``.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import tenure
import tenure.sync
from tenure import LockLost, LockService, Outcome, StoreUnavailable, current_lock
from tenure.lease import LOST_BY_DEADLINE, LOST_BY_STORE
from tenure.stores.base import AcquireItem

from ..conftest import StoreKind
from ..helpers.lapse import lapse
from ..helpers.sync_as_async import ServiceOverSync

TTL = 1.0

asyncio_only = pytest.mark.asyncio_only


@pytest.fixture(params=["asyncio", "sync"])
def api(request: pytest.FixtureRequest) -> str:
    if request.param == "sync" and request.node.get_closest_marker("asyncio_only"):
        pytest.skip("about async functions or task cancellation: the asyncio API only")
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
    """A second service on the same store: another instance of the application."""
    service = await _service(api, url)
    yield service
    await service.__aexit__(None, None, None)


async def test_acquire_grants_and_contention_returns_none(
    locks: LockService, other: LockService
) -> None:
    lock = await locks.acquire("job", ttl=TTL)
    assert lock is not None
    assert lock.name == "job"
    assert lock.held
    assert not lock.lost
    assert await other.acquire("job", ttl=TTL) is None
    assert await locks.acquire("job", ttl=TTL) is None, "a lock is not reentrant"
    assert await other.acquire("another", ttl=TTL) is not None


def test_a_lock_shows_its_public_api_only() -> None:
    """The renewer's state is the lock's own, not inherited: ``dir`` shows
    what a caller may use, on both APIs."""
    shown = {"acquired_at", "fencing_token", "held", "held_until", "loss_error", "lost"}
    shown |= {"lost_reason", "name", "release", "token", "ttl", "wait_lost"}
    assert {n for n in dir(tenure.Lock) if not n.startswith("_")} == shown
    blocking = shown - {"acquired_at", "loss_error"}
    assert {n for n in dir(tenure.sync.Lock) if not n.startswith("_")} == blocking


async def test_default_ttl_is_thirty_seconds(locks: LockService) -> None:
    lock = await locks.acquire("default-ttl")
    assert lock is not None
    assert lock.ttl == 30.0
    [info] = await locks.store.holders("default-ttl")
    assert 28.0 < info.expires_in <= 30.0


async def test_tokens_are_128_bit_secrets_and_never_shown(locks: LockService) -> None:
    tokens = set()
    for _ in range(20):
        lock = await locks.acquire("tok", ttl=TTL)
        assert lock is not None
        assert re.fullmatch(r"[0-9a-f]{32}", lock.token)
        assert lock.token not in repr(lock)
        tokens.add(lock.token)
        for info in await locks.store.holders():
            assert lock.token not in repr(info)
        assert await lock.release()
    assert len(tokens) == 20


async def test_release_is_true_once_then_false(locks: LockService, other: LockService) -> None:
    lock = await locks.acquire("rel", ttl=TTL)
    assert lock is not None
    assert await lock.release() is True
    assert not lock.held
    assert not lock.lost
    assert await lock.release() is False
    again = await other.acquire("rel", ttl=TTL)
    assert again is not None
    assert again.fencing_token > lock.fencing_token


async def test_fencing_tokens_increase_across_release_and_expiry(locks: LockService) -> None:
    store = locks.store
    fences = []
    for _ in range(3):
        lock = await locks.acquire("fence", ttl=TTL)
        assert lock is not None
        fences.append(lock.fencing_token)
        await lock.release()
    # A grant that lapses (taken straight from the store: nobody renews it).
    grant = await store.acquire("fence", "f" * 32, 0.3, "test")
    assert grant is not None
    fences.append(grant.fencing_token)
    await asyncio.sleep(lapse(store, 0.3))
    lock = await locks.acquire("fence", ttl=TTL)
    assert lock is not None
    fences.append(lock.fencing_token)
    assert fences == sorted(set(fences)), fences


async def test_an_acquire_resent_with_the_holders_token_is_granted_again(
    locks: LockService,
) -> None:
    """An acquire whose answer was lost, sent again with its token, is "yours":
    the same fence; any other token is refused."""
    store = locks.store
    token = "r" * 32
    grant = await store.acquire("resent", token, 2.0, "h")
    assert grant is not None
    assert await store.acquire("resent", token, 2.0, "h") == grant
    assert await store.acquire("resent", "o" * 32, 2.0, "other") is None
    assert await store.acquire_many([AcquireItem("resent", token, 2.0, "h")]) == [grant]
    [info] = await store.holders("resent")
    assert info.fencing_token == grant.fencing_token
    assert await store.release("resent", token) is True
    later = await store.acquire("resent", token, 2.0, "h")  # released: a new grant
    assert later is not None and later.fencing_token > grant.fencing_token
    assert await store.release("resent", token) is True


async def test_stale_release_and_renew_are_no_ops(locks: LockService, other: LockService) -> None:
    store = locks.store
    stale = "a" * 32
    assert await store.acquire("stale", stale, 0.3, "old-holder") is not None
    await asyncio.sleep(lapse(store, 0.3))  # the old holder's lease lapses
    fresh = await other.acquire("stale", ttl=TTL)
    assert fresh is not None, "a lapsed lease must be free"
    from tenure.stores import RenewItem

    assert await store.renew([RenewItem("stale", stale, 5.0)]) == [False]
    assert await store.release("stale", stale) is False
    assert fresh.held
    [info] = await store.holders("stale")
    assert info.fencing_token == fresh.fencing_token
    assert await locks.acquire("stale", ttl=TTL) is None, "the new holder keeps its lock"
    assert await fresh.release() is True


async def test_lapsed_grant_release_cleans_up_and_returns_false(locks: LockService) -> None:
    store = locks.store
    token = "b" * 32
    assert await store.acquire("lapsed", token, 0.3, "h") is not None
    await asyncio.sleep(lapse(store, 0.3))
    assert await store.release("lapsed", token) is False
    assert await store.holders("lapsed") == []


async def test_slow_holder_keeps_its_lock_past_many_ttls(
    locks: LockService, other: LockService
) -> None:
    lock = await locks.acquire("slow", ttl=TTL)
    assert lock is not None
    start_trips = locks.renewer.round_trips
    lowest = TTL
    end = time.monotonic() + 3 * TTL
    while time.monotonic() < end:
        assert lock.held
        assert await other.acquire("slow", ttl=TTL) is None
        [info] = await other.store.holders("slow")
        lowest = min(lowest, info.expires_in)
        await asyncio.sleep(0.05)
    # Renewed at about TTL/3, so the store never saw the lease come close to
    # expiry (etcd reports whole seconds left: a 1 s lease shows 0 while alive).
    assert lowest > TTL / 3 or (locks.store.scheme == "etcd" and lowest == 0), lowest
    assert locks.renewer.round_trips - start_trips >= 6
    assert await lock.release() is True


async def test_one_renewer_thread_batches_all_locks(locks: LockService) -> None:
    held = [await locks.acquire(f"batch-{i}", ttl=1.5) for i in range(200)]
    assert all(held)
    renewers = [t for t in threading.enumerate() if t.name == "tenure-renewer"]
    assert len(renewers) >= 1
    start = locks.renewer.round_trips
    await asyncio.sleep(3 * 0.5 + 0.2)  # three renewal intervals
    trips = locks.renewer.round_trips - start
    # 200 locks over three intervals: a trip per lock would be 600.
    assert 1 <= trips <= 9, trips
    assert all(lock is not None and lock.held for lock in held)


async def test_only_one_renewer_thread_per_service(url: str) -> None:
    before = sum(t.name == "tenure-renewer" for t in threading.enumerate())
    async with LockService.from_url(url) as service:
        for i in range(20):
            assert await service.acquire(f"t-{i}", ttl=TTL)
        during = sum(t.name == "tenure-renewer" for t in threading.enumerate())
    after = sum(t.name == "tenure-renewer" for t in threading.enumerate())
    assert during == before + 1
    assert after == before


async def test_token_gone_is_signalled_as_loss(locks: LockService) -> None:
    lock = await locks.acquire("vanish", ttl=TTL)
    assert lock is not None
    # The lease disappears from under its holder (an operator's forced
    # release, a store that lost data): the next renewal finds the token gone.
    assert await locks.store.release("vanish", lock.token) is True
    await asyncio.wait_for(lock.wait_lost(), 2 * TTL)
    assert lock.lost
    assert not lock.held
    assert lock.lost_reason == LOST_BY_STORE
    assert await lock.release() is False


async def test_unreachable_store_loses_the_lock_at_its_local_deadline(
    kind: StoreKind, locks: LockService
) -> None:
    lock = await locks.acquire("cutoff", ttl=TTL)
    assert lock is not None
    trips = locks.renewer.round_trips
    start = time.monotonic()
    with kind.outage(locks.store):
        await asyncio.wait_for(lock.wait_lost(), 3 * TTL)
        lost_after = time.monotonic() - start
        assert not lock.held
        assert lock.lost
        assert lock.lost_reason == LOST_BY_DEADLINE
    # The fault bit: at least one renewal was attempted during the outage and
    # the loss came no later than the TTL (it is declared before the store's expiry).
    assert locks.renewer.round_trips > trips
    assert lost_after < TTL + 0.5
    assert await lock.release() is False


async def test_acquire_fails_closed_when_store_is_unreachable(
    kind: StoreKind, locks: LockService
) -> None:
    if kind.name == "memory":
        pytest.skip("the memory store cannot be unreachable: an outage only blocks it")
    with kind.outage(locks.store), pytest.raises(StoreUnavailable) as caught:
        await locks.acquire("closed", ttl=TTL)
    assert caught.value.__cause__ is not None
    assert await locks.store.holders("closed") == []


async def test_wait_is_woken_by_release(locks: LockService, other: LockService) -> None:
    lock = await locks.acquire("handoff", ttl=TTL)
    assert lock is not None
    waiter = asyncio.ensure_future(other.acquire("handoff", ttl=TTL, wait=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await lock.release()
    got = await asyncio.wait_for(waiter, 5)
    assert got is not None
    assert got.fencing_token > lock.fencing_token


async def test_wait_is_woken_by_expiry_of_a_crashed_holder(locks: LockService) -> None:
    assert await locks.store.acquire("crashed", "c" * 32, 0.6, "dead") is not None
    # Generous: etcd renews every lease when its leader changes, and a loaded
    # machine's short election timeouts change it often. Woken, not timed out:
    # the wait ends well before its deadline.
    wait = 30.0
    start = time.monotonic()
    got = await locks.acquire("crashed", ttl=TTL, wait=wait)
    assert got is not None
    assert time.monotonic() - start < wait - 1


async def test_wait_times_out_with_none(locks: LockService, other: LockService) -> None:
    lock = await locks.acquire("busy", ttl=TTL)
    assert lock is not None
    start = time.monotonic()
    assert await other.acquire("busy", ttl=TTL, wait=0.3) is None
    assert time.monotonic() - start >= 0.3
    assert lock.held


async def test_many_waiters_each_get_it_in_turn(locks: LockService, other: LockService) -> None:
    first = await locks.acquire("queue", ttl=TTL)
    assert first is not None
    order: list[int] = []

    async def wait_then_hold(i: int) -> None:
        lock = await other.acquire("queue", ttl=TTL, wait=10)
        assert lock is not None
        order.append(lock.fencing_token)
        await asyncio.sleep(0.01)
        assert await lock.release()

    tasks = [asyncio.ensure_future(wait_then_hold(i)) for i in range(4)]
    await asyncio.sleep(0.1)
    await first.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == sorted(order)
    assert len(set(order)) == 4


@asyncio_only
async def test_run_exclusively_runs_and_skips(locks: LockService, other: LockService) -> None:
    calls: list[str] = []

    async def work(tag: str, *, suffix: str) -> None:
        calls.append(tag + suffix)
        assert current_lock().name == "excl"
        assert current_lock().held
        assert await other.run_exclusively("excl", work, "inner", suffix="!") is Outcome.SKIPPED

    outcome = await locks.run_exclusively("excl", work, "outer", suffix="?", ttl=TTL)
    assert outcome is Outcome.RAN
    as_str: str = outcome
    assert as_str == "ran", "Outcome is a StrEnum: it equals its plain string"
    assert calls == ["outer?"]
    assert str(Outcome.SKIPPED) == "skipped"
    assert Outcome("skipped") is Outcome.SKIPPED
    assert await other.acquire("excl", ttl=TTL) is not None, "released after the run"


@asyncio_only
async def test_run_exclusively_propagates_errors_after_release(locks: LockService) -> None:
    async def boom() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        await locks.run_exclusively("err", boom, ttl=TTL)
    assert await locks.acquire("err", ttl=TTL) is not None


@asyncio_only
async def test_run_exclusively_cancels_work_on_loss(locks: LockService) -> None:
    cancelled = asyncio.Event()

    async def long_work() -> None:
        lock = current_lock()
        await locks.store.release(lock.name, lock.token)  # the lease vanishes
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(LockLost) as caught:
        await asyncio.wait_for(locks.run_exclusively("lose", long_work, ttl=TTL), 10)
    assert caught.value.name == "lose"
    assert cancelled.is_set()


async def test_plain_function_runs_in_a_worker_thread(locks: LockService) -> None:
    seen: dict[str, object] = {}

    def work(x: int) -> None:
        seen["thread"] = threading.get_ident()
        seen["held"] = current_lock().held
        seen["x"] = x

    assert await locks.run_exclusively("sync", work, 7, ttl=TTL) is Outcome.RAN
    assert seen["thread"] != threading.get_ident()
    assert seen == {"thread": seen["thread"], "held": True, "x": 7}


async def test_plain_function_loss_raises_when_it_returns(locks: LockService) -> None:
    store = locks.store
    loop = asyncio.get_running_loop()
    observed: list[bool] = []

    def work() -> None:
        lock = current_lock()
        asyncio.run_coroutine_threadsafe(store.release(lock.name, lock.token), loop).result()
        end = time.monotonic() + 5
        while lock.held and time.monotonic() < end:
            time.sleep(0.01)
        observed.append(lock.held)

    with pytest.raises(LockLost):
        await locks.run_exclusively("sync-lose", work, ttl=TTL)
    assert observed == [False]


@asyncio_only
async def test_cancelling_run_exclusively_releases(locks: LockService) -> None:
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(locks.run_exclusively("cancel", work, ttl=TTL))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await locks.store.holders("cancel") == []


@asyncio_only
async def test_cancelling_a_plain_function_keeps_the_lock_until_it_returns(
    locks: LockService,
) -> None:
    started = threading.Event()
    finish = threading.Event()

    def work() -> None:
        started.set()
        finish.wait(10)

    task = asyncio.ensure_future(locks.run_exclusively("cancel-sync", work, ttl=TTL))
    await asyncio.to_thread(started.wait)
    task.cancel()
    await asyncio.sleep(0.1)
    assert not task.done()
    assert len(await locks.store.holders("cancel-sync")) == 1, "still running, still held"
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await locks.store.holders("cancel-sync") == []


@asyncio_only
@pytest.mark.parametrize("wait", [0.0, 30.0])
async def test_a_cancelled_acquire_raises_wherever_the_cancel_lands(
    locks: LockService, wait: float
) -> None:
    """Cancelled after 0, 1, 2... turns of the loop, so the cancellation lands
    at each step of the call's way to the store and back: every one that is
    accepted ends the call with CancelledError, never with a lock (redis-py
    on Python 3.11 can swallow one that comes as a command is written), and
    what the store granted meanwhile is given back."""
    cancelled = 0
    returned = []
    for steps in range(60):
        task = asyncio.ensure_future(locks.acquire("cancelled", ttl=TTL, wait=wait))
        for _ in range(steps):
            await asyncio.sleep(0)
        if not task.cancel():  # done before the cancel
            lock = task.result()
            assert lock is not None
            await lock.release()
            continue
        try:
            lock = await task
        except asyncio.CancelledError:
            cancelled += 1
            continue
        returned.append(steps)
        if lock is not None:
            await lock.release()
    assert returned == [], "cancelled, yet the acquire returned"
    assert cancelled > 0, "no cancellation reached the call"

    async def given_back() -> bool:
        return await locks.store.holders("cancelled") == []

    for _ in range(100):
        if await given_back():
            break
        await asyncio.sleep(0.05)
    assert await given_back(), "a lease a cancelled acquire obtained was kept"


async def test_async_with_lock_releases_on_exception(locks: LockService) -> None:
    lock = await locks.acquire("ctx", ttl=TTL)
    assert lock is not None
    with pytest.raises(ZeroDivisionError):
        async with lock:
            _ = 1 / 0
    assert not lock.held
    assert not lock.lost
    assert await locks.acquire("ctx", ttl=TTL) is not None


async def test_closing_the_service_releases_everything(url: str) -> None:
    async with LockService.from_url(url) as first:
        held = [await first.acquire(f"close-{i}", ttl=TTL) for i in range(3)]
        assert all(held)
    assert all(lock is not None and not lock.held for lock in held)
    async with LockService.from_url(url) as second:
        for i in range(3):
            assert await second.acquire(f"close-{i}", ttl=TTL) is not None


async def test_wait_lost_returns_on_release(locks: LockService) -> None:
    lock = await locks.acquire("wl", ttl=TTL)
    assert lock is not None
    waiting = asyncio.ensure_future(lock.wait_lost())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await lock.release()
    await asyncio.wait_for(waiting, 2)
    assert not lock.lost


async def test_holders_lists_live_leases_without_tokens(locks: LockService) -> None:
    a = await locks.acquire("h:a", ttl=TTL)
    b = await locks.acquire("h:b", ttl=TTL)
    await locks.acquire("other", ttl=TTL)
    assert a is not None
    assert b is not None
    infos = await locks.store.holders("h:")
    assert [i.name for i in infos] == ["h:a", "h:b"]
    assert all(i.holder == locks.holder for i in infos)
    assert [i.fencing_token for i in infos] == [a.fencing_token, b.fencing_token]
    for info in infos:  # the store's clock or the acquiring host's: close to ours
        assert info.acquired_at is not None and abs(info.acquired_at - time.time()) < 5


@asyncio_only
async def test_force_release_evicts_the_holder_wakes_waiters_and_fences(
    locks: LockService, other: LockService
) -> None:
    lock = await locks.acquire("stuck", ttl=TTL)
    assert lock is not None
    waiter = asyncio.ensure_future(other.acquire("stuck", ttl=TTL, wait=5))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    evicted = await other.store.force_release("stuck")
    assert evicted is not None
    assert (evicted.name, evicted.holder) == ("stuck", locks.holder)
    assert evicted.fencing_token == lock.fencing_token
    got = await asyncio.wait_for(waiter, 3)
    assert got is not None, "the waiter was woken and granted the lock"
    assert got.fencing_token > lock.fencing_token
    if other.store.scheme in ("memory", "sqlite"):  # per-name counters: the bump shows
        assert got.fencing_token == lock.fencing_token + 2
    await asyncio.sleep(TTL / 2)  # the evicted holder's next renewal fails
    assert lock.lost and not lock.held
    assert await lock.release() is False
    assert got.held, "the new holder is untouched"
    assert await got.release() is True
    assert await other.store.force_release("stuck") is None, "nothing left to free"
