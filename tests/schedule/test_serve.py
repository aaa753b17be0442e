"""The timer loop: overlaps, misfires, graceful stop, per-instance tasks, one loop."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence

import pytest

from tenure import InvalidArgument, LockService, RunOutcome, Scheduler
from tenure.stores.memory import MemoryStore
from tenure.stores.runlog import Claim


class FakeClock:
    """POSIX seconds that the test moves; real time passes underneath."""

    def __init__(self, start: float) -> None:
        self.offset = start - time.time()

    def __call__(self) -> float:
        return time.time() + self.offset

    def jump_to(self, t: float) -> None:
        self.offset = t - time.time()


async def serve_for(scheduler: Scheduler, seconds: float) -> None:
    serving = asyncio.ensure_future(scheduler.serve())
    await asyncio.sleep(seconds)
    scheduler.stop()
    await asyncio.wait_for(serving, 30)


async def test_a_run_that_outlives_its_ttl_keeps_the_lock_and_later_occurrences_skip(
    locks: LockService, other: LockService
) -> None:
    scheduler = Scheduler(locks, prune=None)
    held_throughout: list[bool] = []

    @scheduler.cron("* * * * * *", name="long", ttl=1)
    async def long() -> None:
        from tenure import current_lock

        if held_throughout:
            return  # a run after the long one: stop() need not wait it out
        end = time.monotonic() + 3.2
        while time.monotonic() < end:
            held_throughout.append(current_lock().held)
            assert await other.acquire("long", ttl=1) is None
            await asyncio.sleep(0.1)

    await serve_for(scheduler, 4.5)
    records = sorted(await locks.store.runlog.runs("long"), key=lambda r: r.started)
    outcomes = [r.outcome for r in records]
    assert outcomes[0] == "ran", outcomes
    assert outcomes.count("ran") <= 2
    assert outcomes[1:4] == ["skipped"] * 3, outcomes
    for skipped in records[1:4]:  # the record says why: who held the lock
        assert skipped.error is not None and f"held by {locks.holder}" in skipped.error
    assert held_throughout
    assert all(held_throughout)
    fires = [r.fire_time or 0.0 for r in records]
    assert fires == sorted(set(fires)), "one record per occurrence"


async def test_a_late_tick_runs_only_within_the_grace_and_never_backfills(
    locks: LockService,
) -> None:
    clock = FakeClock(1_800_000_058.0)  # 2 s before a minute boundary
    scheduler = Scheduler(locks, clock=clock, misfire_grace=5, prune=None)
    ran: list[float] = []
    scheduler.add(lambda: ran.append(clock()), "* * * * *", name="minutely")
    serving = asyncio.ensure_future(scheduler.serve())
    await asyncio.sleep(0.2)
    clock.jump_to(1_800_000_070.0)  # the 1_800_000_060 occurrence, 10 s late: beyond grace
    await asyncio.sleep(1.5)
    assert ran == []
    clock.jump_to(1_800_000_302.5)  # four minutes later: only the latest, 2.5 s late
    await asyncio.sleep(1.5)
    scheduler.stop()
    await serving
    records = await locks.store.runlog.runs("minutely")
    assert [r.fire_time for r in records] == [1_800_000_300.0]
    assert len(ran) == 1


async def test_stop_waits_for_running_tasks_then_cancels(locks: LockService) -> None:
    scheduler = Scheduler(locks, shutdown_timeout=0.5, prune=None)
    started = asyncio.Event()
    quick_done: list[bool] = []

    @scheduler.cron("* * * * * *", name="slow")
    async def slow() -> None:
        started.set()
        await asyncio.sleep(60)

    @scheduler.cron("* * * * * *", name="quick")
    async def quick() -> None:
        await asyncio.sleep(0.2)
        quick_done.append(True)

    serving = asyncio.ensure_future(scheduler.serve())
    await asyncio.wait_for(started.wait(), 5)
    scheduler.stop()
    begun = time.monotonic()
    await asyncio.wait_for(serving, 10)
    assert time.monotonic() - begun >= 0.2
    assert quick_done, "a task that finishes within the timeout is waited for"
    [record] = [r for r in await locks.store.runlog.runs("slow") if r.outcome != "skipped"][:1]
    assert record.outcome == RunOutcome.FAILED
    assert "cancelled" in (record.error or "")
    assert await locks.store.holders("slow") == [], "its lock was released"


async def test_per_instance_tasks_run_on_every_instance(
    locks: LockService, other: LockService
) -> None:
    counts = {"a": 0, "b": 0}
    schedulers = []
    for service, key in ((locks, "a"), (other, "b")):
        s = Scheduler(service, prune=None)

        def bump(key: str = key) -> None:
            counts[key] += 1

        s.add(bump, "* * * * * *", name="everywhere", exclusive=False)
        schedulers.append(s)
    await asyncio.gather(*(serve_for(s, 2.6) for s in schedulers))
    assert counts["a"] >= 2
    assert counts["b"] >= 2
    assert abs(counts["a"] - counts["b"]) <= 1
    assert await locks.store.holders("everywhere") == []


async def test_a_thousand_tasks_are_one_timer_loop(locks: LockService) -> None:
    scheduler = Scheduler(locks, prune=None)
    for i in range(1000):
        scheduler.add(lambda: None, "0 3 * * *", name=f"nightly-{i}")
    await locks.store.server_time()  # the store's own machinery (pools) starts here
    before = len(asyncio.all_tasks())
    serving = asyncio.ensure_future(scheduler.serve())
    await asyncio.sleep(0.3)
    # serve(), the one timer it waits on, the clock-skew watcher and the keeper
    # of the instance's presence lease, whatever the number of tasks
    assert len(asyncio.all_tasks()) <= before + 4
    scheduler.stop()
    await serving


async def test_cancelling_serve_cancels_running_tasks(locks: LockService) -> None:
    scheduler = Scheduler(locks, shutdown_timeout=0.2, prune=None)
    started = asyncio.Event()

    @scheduler.cron("* * * * * *", name="endless")
    async def endless() -> None:
        started.set()
        await asyncio.sleep(60)

    serving = asyncio.ensure_future(scheduler.serve())
    await asyncio.wait_for(started.wait(), 5)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert await locks.store.holders("endless") == []


async def test_clock_skew_against_the_store_is_measured_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tenure import Event

    from ..conftest import redis_server

    seen: list[Event] = []
    async with LockService.from_url(redis_server().url) as locks:
        locks.subscribe(seen.append)
        ahead = Scheduler(locks, clock=lambda: time.time() + 5.0, prune=None)
        ahead.add(lambda: None, "0 0 1 1 *", name="yearly")
        in_sync = Scheduler(locks, prune=None)
        in_sync.add(lambda: None, "0 0 1 1 *", name="yearly-too")
        with caplog.at_level(logging.WARNING, logger="tenure.scheduler"):
            for scheduler in (ahead, in_sync):
                serving = asyncio.ensure_future(scheduler.serve())
                await asyncio.sleep(0.3)
                scheduler.stop()
                await serving
            ahead._skew.judge(5.1)  # a later measurement, barely changed: no repeat
    assert ahead.skew is not None and 4.9 < ahead.skew < 5.2
    assert in_sync.skew is not None and abs(in_sync.skew) < 0.5
    warnings = [r.getMessage() for r in caplog.records if "clock is" in r.getMessage()]
    assert len(warnings) == 1
    said = re.search(r"clock is ([0-9.]+) s ahead of the store's", warnings[0])
    assert said is not None and 4.9 < float(said.group(1)) < 5.2, warnings[0]
    [skew] = [e for e in seen if e.kind == "skew"]
    assert skew.seconds is not None and 4.9 < skew.seconds < 5.2


async def test_no_skew_check_on_a_store_without_a_clock(locks: LockService) -> None:
    scheduler = Scheduler(locks, prune=None)
    scheduler.add(lambda: None, "0 0 1 1 *", name="yearly")
    serving = asyncio.ensure_future(scheduler.serve())
    await asyncio.sleep(0.2)
    # A fresh PostgreSQL prefix makes its tables first: on a busy host the
    # first measurement can take longer than the sleep above.
    for _ in range(100):
        if scheduler.skew is not None or locks.store.scheme in ("sqlite", "memory", "etcd"):
            break
        await asyncio.sleep(0.1)
    scheduler.stop()
    await serving
    if locks.store.scheme in ("sqlite", "memory", "etcd"):
        assert scheduler.skew is None
    else:
        assert scheduler.skew is not None and abs(scheduler.skew) < 0.5


class _GatedClaims(MemoryStore):
    """The memory store, whose batch claims wait at a gate the test opens."""

    def __init__(self) -> None:
        super().__init__()
        self.claiming = asyncio.Event()
        self.opened = asyncio.Event()
        claim = self.runlog.claim_occurrences

        async def gated(claims: Sequence[Claim]) -> list[bool]:
            self.claiming.set()
            await self.opened.wait()
            return await claim(claims)

        self.runlog.claim_occurrences = gated  # type: ignore[method-assign]


async def test_stop_while_a_tick_is_claiming_still_runs_what_it_won() -> None:
    """serve() returns only after the runs a tick started, even when stop()
    came while that tick's claims were on their way (no run is left behind)."""
    store = _GatedClaims()
    ran: list[str] = []
    async with LockService(store) as locks:
        scheduler = Scheduler(locks, prune=None)
        for i in range(3):

            async def task(i: int = i) -> None:
                await asyncio.sleep(0.2)
                ran.append(f"t{i}")

            scheduler.add(task, "* * * * * *", name=f"t{i}")
        serving = asyncio.ensure_future(scheduler.serve())
        await asyncio.wait_for(store.claiming.wait(), 5)
        scheduler.stop()
        await asyncio.sleep(0.1)
        assert not serving.done(), "serve() waits for the tick that is claiming"
        store.opened.set()
        await asyncio.wait_for(serving, 10)
        assert sorted(ran) == ["t0", "t1", "t2"], "each won occurrence ran to its end"
        assert scheduler.tasks.counts[RunOutcome.RAN] == 3


async def test_async_with_serves_in_the_background_and_stops_gracefully() -> None:
    locks = LockService(MemoryStore())
    scheduler = Scheduler(locks, prune=None, shutdown_timeout=5)
    finished: list[float] = []

    @scheduler.cron("* * * * * *", name="tick")
    async def tick() -> None:
        await asyncio.sleep(0.3)  # still running at the exit: it is waited for
        finished.append(time.time())

    async with locks, scheduler:
        with pytest.raises(InvalidArgument, match="already serving"):
            await scheduler.__aenter__()
        await asyncio.sleep(2.2)
    exited = time.time()
    assert len(finished) >= 2, "it served in the background"
    assert scheduler.cancelled == 0
    records = await locks.store.runlog.runs("tick")
    assert records and all(r.outcome == RunOutcome.RAN for r in records), records
    assert all(r.ended is not None and r.ended <= exited for r in records)
    await scheduler.aclose()  # not serving: nothing to do


async def test_aclose_cancels_what_outlives_the_shutdown_timeout() -> None:
    locks = LockService(MemoryStore())
    scheduler = Scheduler(locks, prune=None, shutdown_timeout=0.5)
    started = asyncio.Event()

    @scheduler.cron("* * * * * *", name="forever")
    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    async with locks:
        await scheduler.__aenter__()
        await asyncio.wait_for(started.wait(), 3)
        before = time.monotonic()
        await scheduler.aclose()
        assert time.monotonic() - before < 5
        assert scheduler.cancelled == 1
        records = await locks.store.runlog.runs("forever")
        # Later occurrences (if a second turned meanwhile) were skipped: its lock was held.
        [record] = [r for r in records if r.outcome != RunOutcome.SKIPPED]
        assert record.outcome == RunOutcome.FAILED and "cancelled" in (record.error or "")
        assert await locks.store.holders("forever") == [], "its lock was released"
