"""Batches on every store: acquire_each, release_each, and the store's batch methods.

Each item of a batch is decided on its own, exactly as the single call would
decide it; a batch longer than the store's ``batch_max`` is split.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from tenure import InvalidArgument, LockService, RunRecord, StoreUnavailable, current_lock
from tenure._tokens import new_token
from tenure.stores.base import AcquireItem, Grant
from tenure.stores.runlog import Claim, Started, StartItem

from ..conftest import StoreKind


async def test_acquire_each_grants_the_free_names_and_not_the_held_ones(
    locks: LockService, other: LockService
) -> None:
    held = await other.acquire("b", ttl=5)
    assert held is not None
    earlier = await locks.acquire("a", ttl=5)
    assert earlier is not None and await earlier.release()
    got = await locks.acquire_each(["a", "b", "c"], ttl=5)
    a, b, c = got
    assert b is None
    assert a is not None and c is not None
    assert (a.name, c.name) == ("a", "c")
    assert a.held and c.held
    assert a.fencing_token > earlier.fencing_token
    # Held for real: the other service cannot take them.
    assert await other.acquire("a") is None
    assert await other.acquire("c") is None
    assert await locks.release_each([a, c]) == [True, True]
    assert not a.held and not c.held
    # Released twice: False, and nothing is sent for it.
    assert await locks.release_each([a]) == [False]
    again = await other.acquire_each(["a", "c"], ttl=5)
    assert all(lock is not None for lock in again)
    assert await other.release_each([lock for lock in again if lock is not None]) == [True, True]
    assert await held.release()


async def test_a_batch_longer_than_the_stores_is_split(locks: LockService) -> None:
    names = [f"n{i}" for i in range(locks.store.batch_max + 5)]
    got = await locks.acquire_each(names, ttl=5)
    assert [lock.name if lock else None for lock in got] == names
    tokens = [lock.fencing_token for lock in got if lock is not None]
    assert len(tokens) == len(names)
    assert await locks.release_each([lock for lock in got if lock is not None]) == [True] * len(
        names
    )


async def test_a_batch_cut_short_gives_back_its_locks_before_the_service_closes(
    url: str,
) -> None:
    """A cancelled acquire_each gives back the locks its earlier chunks got,
    in the background; a close() right after waits for those releases, so the
    names are free at once rather than when their TTL runs out."""
    locks = LockService.from_url(url)
    store = locks.store
    size = store.batch_max
    names = [f"cut{i}" for i in range(size + 1)]
    real = store.acquire_many
    sent: list[int] = []
    second = asyncio.Event()
    never = asyncio.Event()

    async def second_never_answered(items: Sequence[AcquireItem]) -> list[Grant | None]:
        sent.append(len(items))
        if len(sent) == 2:
            second.set()
            await never.wait()  # its answer is lost: the caller gives up
        return await real(items)

    store.acquire_many = second_never_answered  # type: ignore[method-assign]
    cut = asyncio.ensure_future(locks.acquire_each(names, ttl=60))
    await asyncio.wait_for(second.wait(), 10)
    cut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut
    await locks.close()
    assert sent == [size, 1], "the first chunk was granted, the second cut short"
    async with LockService.from_url(url) as other:
        got = await other.acquire_each(names[:size], ttl=5)
        assert all(lock is not None for lock in got), "a lock of the first chunk is still held"
        await other.release_each([lock for lock in got if lock is not None])


async def test_locks_of_a_batch_are_renewed_past_their_ttl(
    locks: LockService, other: LockService
) -> None:
    got = await locks.acquire_each(["r1", "r2"], ttl=1)
    await asyncio.sleep(2.5)
    assert all(lock is not None and lock.held for lock in got)
    assert await other.acquire("r1") is None
    assert await locks.release_each([lock for lock in got if lock is not None]) == [True, True]


async def test_run_under_runs_with_the_lock_as_current_lock(locks: LockService) -> None:
    (lock,) = await locks.acquire_each(["job"], ttl=5)
    assert lock is not None
    seen: list[object] = []

    async def job() -> None:
        seen.append(current_lock())

    def plain() -> None:
        seen.append(current_lock())

    await locks.run_under(lock, job)
    await locks.run_under(lock, plain)
    assert seen == [lock, lock]
    assert lock.held, "run_under does not release"
    assert await lock.release()


@pytest.mark.parametrize(
    ("names", "complaint"),
    [
        ("abc", "takes a list of names"),
        (["a", "a"], "'a' is given twice"),
        (["a", ""], "name"),
        (["a", 3], "name"),
    ],
)
async def test_acquire_each_refuses_bad_input_and_acquires_nothing(
    locks: LockService, other: LockService, names: object, complaint: str
) -> None:
    with pytest.raises(InvalidArgument, match=complaint):
        await locks.acquire_each(names)  # type: ignore[arg-type]
    assert await other.acquire("a") is not None, "nothing of the bad batch was acquired"


async def test_release_each_and_run_under_refuse_foreign_locks(
    locks: LockService, other: LockService
) -> None:
    theirs = await other.acquire("x", ttl=5)
    assert theirs is not None
    with pytest.raises(InvalidArgument, match="locks of this service"):
        await locks.release_each([theirs])
    with pytest.raises(InvalidArgument, match="lock of this service"):
        await locks.run_under(theirs, lambda: None)
    assert theirs.held
    assert await theirs.release()


async def test_claim_occurrences_decides_each_claim_as_claim_occurrence(
    locks: LockService,
) -> None:
    store = locks.store
    me, you = "host:1:me", "host:2:you"
    assert await store.runlog.claim_occurrences([Claim("a", 10.0, me), Claim("b", 10.0, me)]) == [
        True,
        True,
    ]
    # a: the same occurrence by another: taken; b: later: claimed; c: new.
    assert await store.runlog.claim_occurrences(
        [Claim("a", 10.0, you), Claim("b", 11.0, you), Claim("c", 1.0, you)]
    ) == [False, True, True]
    assert await store.runlog.claim_occurrences([Claim("a", 9.0, me)]) == [False]
    assert await store.runlog.claim_occurrence("b", 11.0, me) is False
    assert await store.runlog.claim_occurrences([]) == []


async def test_a_claim_resent_by_its_claimant_is_still_its_own(locks: LockService) -> None:
    """The answer to a claim was lost and the claimant sends it again: yours,
    not "claimed elsewhere" (which would lose the occurrence)."""
    store = locks.store
    assert await store.runlog.claim_occurrence("job", 60.0, "host:1:me") is True
    assert await store.runlog.claim_occurrence("job", 60.0, "host:1:me") is True
    assert await store.runlog.claim_occurrences([Claim("job", 60.0, "host:1:me")]) == [True]
    assert await store.runlog.claim_occurrence("job", 60.0, "host:2:you") is False
    # Once a later occurrence is claimed, the earlier one is nobody's to resend.
    assert await store.runlog.claim_occurrence("job", 120.0, "host:2:you") is True
    assert await store.runlog.claim_occurrence("job", 60.0, "host:1:me") is False
    assert await store.runlog.claim_occurrence("job", 120.0, "host:1:me") is False


async def test_claimed_already_reads_which_occurrences_a_claim_would_lose(
    locks: LockService,
) -> None:
    store = locks.store
    me = "host:1:me"
    assert await store.runlog.claim_occurrences([Claim("a", 10.0, me), Claim("b", 10.0, me)]) == [
        True,
        True,
    ]
    asked = [("a", 10.0), ("a", 9.0), ("b", 11.0), ("never", 1.0)]
    # The same or an earlier occurrence is taken; a later one and an unclaimed task are not.
    assert await store.runlog.claimed_already(asked) == [True, True, False, False]
    # It only read: the later occurrence is still free to claim.
    assert await store.runlog.claim_occurrence("b", 11.0, "host:2:you") is True
    assert await store.runlog.claimed_already([("b", 11.0)]) == [True]
    assert await store.runlog.claimed_already([]) == []


async def test_start_runs_claims_acquires_and_records_each_occurrence(
    locks: LockService, other: LockService
) -> None:
    """Each item: claimed, then (if claimed) its lock, then (if granted) its
    start record; the same item sent again answers as the first time did."""
    store = locks.store
    me, you = locks.holder, other.holder
    held = await other.acquire("busy", ttl=5)
    assert held is not None
    assert await store.runlog.claim_occurrence("taken", 60.0, "host:2:you") is True

    def start(task: str, claimant: str, holder: str) -> StartItem:
        record = RunRecord(f"run-{task}", task, 60.0, holder, time.time(), None, "running")
        lock = AcquireItem(task, new_token(), 5.0, holder)
        return StartItem(Claim(task, 60.0, claimant), lock, record)

    items = [start(task, "host:1:me", me) for task in ("free", "busy", "taken")]
    free, busy, taken = await store.runlog.start_runs(items, keep=10)
    assert free.claimed and free.grant is not None
    assert busy.claimed and busy.grant is None, "claimed; its lock is held by another"
    assert not taken.claimed and taken.grant is None, "claimed by another first"
    [info] = await store.holders("free")
    assert (info.holder, info.fencing_token) == (me, free.grant.fencing_token)
    stored = await store.runlog.stored_runs("free")
    # The record names the grant, written in the same step as the claim.
    assert [(r.run_id, r.outcome, r.fence) for r in stored] == [
        ("run-free", "running", free.grant.fencing_token)
    ]
    assert (
        await store.runlog.stored_runs("busy") == []
        and await store.runlog.stored_runs("taken") == []
    )
    # Resent after a lost answer: the claim, the lock and the record are its own still.
    again = await store.runlog.start_runs(items[:1], keep=10)
    assert again == [free]
    assert [r.fence for r in await store.runlog.stored_runs("free")] == [free.grant.fencing_token]
    # Another claimant of the same occurrence gets nothing.
    assert await store.runlog.start_runs([start("free", "host:2:you", you)], keep=10) == [
        Started(False, None)
    ]
    assert await store.runlog.start_runs([], keep=10) == []
    assert await store.release("free", items[0].lock.token)
    assert await held.release()


async def test_record_runs_keeps_the_newest_of_each_task(locks: LockService) -> None:
    store = locks.store
    now = time.time()
    for round_ in range(4):
        started = [
            RunRecord(f"{task}-{round_}", task, now + round_, "me", now + round_, None, "running")
            for task in ("p", "q")
        ]
        await store.runlog.record_runs(started, keep=2)
        ended = [
            RunRecord(r.run_id, r.task, r.fire_time, "me", r.started, r.started + 0.5, "ran")
            for r in started
        ]
        await store.runlog.record_runs(ended, keep=2)
    for task in ("p", "q"):
        runs = await store.runlog.runs(task)
        assert [r.run_id for r in runs] == [f"{task}-3", f"{task}-2"]
        assert {r.outcome for r in runs} == {"ran"}
    # One batch with several ended runs of a task (a manual run and scheduled
    # ones ending together): the newest two of all its runs stay.
    together = [
        RunRecord(f"p-{k}", "p", now + k, "me", now + k, now + k + 0.5, "ran") for k in (4, 6, 5)
    ]
    await store.runlog.record_runs(together, keep=2)
    assert [r.run_id for r in await store.runlog.runs("p")] == ["p-6", "p-5"]
    assert [r.run_id for r in await store.runlog.runs("q")] == ["q-3", "q-2"]


async def test_a_batch_the_store_fails_raises_and_keeps_nothing(
    shared_kind: StoreKind, shared_url: str
) -> None:
    async with (
        LockService.from_url(shared_url) as locks,
        LockService.from_url(shared_url) as other,
    ):
        await locks.store.runlog.runs()  # connected (and tables made) before the outage
        with shared_kind.outage(locks.store), pytest.raises(StoreUnavailable):
            await locks.acquire_each(["f1", "f2"], ttl=2)
        # Whatever the store applied is given back (or lapses within the TTL).
        deadline = time.monotonic() + 10
        while True:
            got = await other.acquire_each(["f1", "f2"], ttl=5)
            if all(lock is not None for lock in got) or time.monotonic() > deadline:
                break
            await other.release_each([lock for lock in got if lock is not None])
            await asyncio.sleep(0.2)
        assert all(lock is not None for lock in got)
