"""A forced release's audit record and event (``LockService.force_release``), on every store."""

from __future__ import annotations

import os
import socket
import time

import pytest

import tenure.sync
from tenure import Event, EventKind, ForcedRelease, InvalidArgument, LockService
from tenure.stores.audit import FORCED_KEEP

TTL = 2.0


async def test_force_release_leaves_an_audit_record_and_an_event(
    locks: LockService, other: LockService
) -> None:
    lock = await locks.acquire("stuck", ttl=TTL)
    assert lock is not None
    events: list[Event] = []
    other.subscribe(events.append)
    before = time.time()
    record = await other.force_release("stuck", operator="ops@console", reason="its host is gone")
    assert record is not None
    assert (record.name, record.evicted, record.fencing_token) == (
        "stuck",
        locks.holder,
        lock.fencing_token,
    )
    assert (record.operator, record.reason) == ("ops@console", "its host is gone")
    assert before <= record.at <= time.time()
    [event] = [e for e in events if e.kind == EventKind.FORCED_RELEASE]
    assert (event.name, event.holder, event.fencing_token) == (
        "stuck",
        other.holder,
        lock.fencing_token,
    )
    assert event.detail == f"ops@console evicted {locks.holder}"
    assert lock.token not in repr(event) and lock.token not in repr(record)
    # Read back by another service of the store, as a record of its own kind:
    # the scheduler's run log has no run for it.
    assert await locks.store.runlog.forced_releases("stuck") == [record]
    assert await locks.store.runlog.runs() == []
    # Nothing held: nothing freed, recorded or emitted.
    await lock.release()
    events.clear()
    assert await other.force_release("stuck") is None
    assert events == []
    assert await other.store.runlog.forced_releases() == [record]


async def test_forced_releases_read_newest_first_and_by_name(
    locks: LockService, other: LockService
) -> None:
    made: list[ForcedRelease] = []
    for name in ("a", "b", "a"):
        lock = await locks.acquire(name, ttl=TTL)
        assert lock is not None
        record = await other.force_release(name)
        assert record is not None
        made.append(record)
        await lock.release()
    runlog = other.store.runlog
    assert await runlog.forced_releases() == made[::-1]
    assert await runlog.forced_releases("a") == [made[2], made[0]]
    assert await runlog.forced_releases("a", limit=1) == [made[2]]
    assert await runlog.forced_releases("nothing") == []
    user = os.environ.get("USER") or str(os.getuid())
    assert made[0].operator == f"{user}@{socket.gethostname()}:{os.getpid()}"
    assert made[0].reason is None


async def test_force_release_refuses_bad_input_and_changes_nothing(
    locks: LockService, other: LockService
) -> None:
    lock = await locks.acquire("stuck", ttl=TTL)
    assert lock is not None
    with pytest.raises(InvalidArgument, match="operator must be a non-empty string"):
        await other.force_release("stuck", operator="  ")
    with pytest.raises(InvalidArgument, match="reason must be a string"):
        await other.force_release("stuck", reason=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="name"):
        await other.force_release("")
    held = await other.store.holder_of("stuck")
    assert held is not None and held.fencing_token == lock.fencing_token
    assert lock.held
    assert await other.store.runlog.forced_releases() == []
    assert await lock.release() is True


async def test_the_store_keeps_the_newest_forced_releases(locks: LockService) -> None:
    runlog = locks.store.runlog
    base = time.time()
    for i in range(FORCED_KEEP + 2):
        await runlog.record_forced(
            ForcedRelease(f"r{i}", f"lock{i % 3}", base + i, "ops", "gone:1:ab", i)
        )
    kept = await runlog.forced_releases(limit=FORCED_KEEP + 10)
    assert [r.record_id for r in kept] == [f"r{i}" for i in range(FORCED_KEEP + 1, 1, -1)]
    assert kept[0] == ForcedRelease(
        f"r{FORCED_KEEP + 1}",
        f"lock{(FORCED_KEEP + 1) % 3}",
        base + FORCED_KEEP + 1,
        "ops",
        "gone:1:ab",
        FORCED_KEEP + 1,
    )


def test_the_blocking_api_forces_a_release_too(url: str) -> None:
    with (
        tenure.sync.LockService.from_url(url) as locks,
        tenure.sync.LockService.from_url(url) as other,
    ):
        lock = locks.acquire("stuck", ttl=TTL)
        assert lock is not None
        record = other.force_release("stuck", reason="from blocking code")
        assert record is not None and record.evicted == locks.holder
        assert record.reason == "from blocking code"
        assert other.force_release("stuck") is None
