"""Registration (errors at registration, not at the first tick) and single runs."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from tenure import (
    InvalidArgument,
    LockService,
    Outcome,
    RunOutcome,
    RunRecord,
    Scheduler,
    current_run,
)
from tenure.schedule import CronSchedule

from ..helpers.lapse import lapse


@pytest.fixture
def scheduler(locks: LockService) -> Scheduler:
    return Scheduler(locks)


async def noop() -> None:
    pass


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("* * *", "3 fields"),
        ("* * * * * * *", "7 fields"),
        ("61 * * * *", "not valid"),
        ("* * * * * 99", "not valid"),
        ("bogus * * * *", "not valid"),
        ("0 0 30 2 *", "never fires"),
        (42, "str"),
    ],
)
def test_bad_expressions_fail_at_registration(
    scheduler: Scheduler, expr: object, says: str
) -> None:
    with pytest.raises(InvalidArgument, match=says):
        scheduler.add(noop, expr, name="t")  # type: ignore[arg-type]
    assert "t" not in scheduler.tasks


def test_unknown_time_zone(scheduler: Scheduler) -> None:
    with pytest.raises(InvalidArgument, match="unknown time zone 'Mars/Olympus'"):
        scheduler.cron("* * * * *", name="t", tz="Mars/Olympus")(noop)
    assert "t" not in scheduler.tasks


@pytest.mark.parametrize(("name", "says"), [("", "empty"), ("a\nb", "control"), (7, "str")])
def test_bad_task_names(scheduler: Scheduler, name: object, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        scheduler.add(noop, "* * * * *", name=name)  # type: ignore[arg-type]


def test_duplicate_names_fail_at_registration(scheduler: Scheduler) -> None:
    scheduler.add(noop, "* * * * *", name="dup")
    with pytest.raises(InvalidArgument, match="already registered"):
        scheduler.add(noop, "*/5 * * * *", name="dup")
    # The default name is the function's qualified name, so the same function twice clashes.
    scheduler.cron("* * * * *")(noop)
    with pytest.raises(InvalidArgument, match="already registered"):
        scheduler.cron("* * * * *")(noop)


def test_other_bad_arguments(scheduler: Scheduler, locks: LockService) -> None:
    with pytest.raises(InvalidArgument, match="callable"):
        scheduler.add("not callable", "* * * * *", name="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="ttl"):
        scheduler.add(noop, "* * * * *", name="x", ttl=0)
    with pytest.raises(InvalidArgument, match="LockService"):
        Scheduler("sqlite:///x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="misfire_grace"):
        Scheduler(locks, misfire_grace=-1)
    with pytest.raises(InvalidArgument, match="keep_runs"):
        Scheduler(locks, keep_runs=0)
    with pytest.raises(InvalidArgument, match="presence_ttl must be positive, got 0"):
        Scheduler(locks, presence_ttl=0)
    with pytest.raises(InvalidArgument, match="presence_ttl must be a number"):
        Scheduler(locks, presence_ttl="15")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="no task named 'missing'"):
        scheduler.tasks["missing"]


def test_time_zones_and_dst_come_from_croniter() -> None:
    berlin = CronSchedule("30 2 * * *", tz="Europe/Berlin")
    # 2026-03-29 is the spring-forward day in Berlin: 02:30 does not exist.
    before = 1774735200.0  # 2026-03-28 22:00 UTC
    first = berlin.next_after(before)
    assert first - before > 3600  # not 02:30 local time on a day that skips it blindly
    seconds = CronSchedule("*/10 * * * * *")
    assert seconds.seconds_field
    assert seconds.next_after(100.0) == 110.0
    assert seconds.latest_at_or_before(119.5) == 110.0
    assert seconds.latest_at_or_before(120.0) == 120.0


async def test_manual_run_is_recorded(scheduler: Scheduler, locks: LockService) -> None:
    seen: list[str] = []

    @scheduler.cron("0 3 * * *", name="nightly")
    async def nightly() -> None:
        seen.append("ran")

    assert await scheduler.tasks.run("nightly") is Outcome.RAN
    assert seen == ["ran"]
    [record] = await locks.store.runlog.runs("nightly")
    assert record.outcome == RunOutcome.RAN
    assert record.fire_time is None
    assert record.instance == locks.holder
    assert record.ended is not None
    assert record.ended >= record.started
    assert record.error is None


async def test_a_runs_record_names_the_fencing_token_it_held(
    scheduler: Scheduler, locks: LockService, other: LockService
) -> None:
    held: list[int] = []
    while_running: list[RunRecord] = []

    @scheduler.cron("0 3 * * *", name="fenced")
    async def fenced() -> None:
        lock = current_run().lock
        assert lock is not None
        held.append(lock.fencing_token)
        while_running.extend(await locks.store.runlog.runs("fenced"))

    assert await scheduler.tasks.run("fenced", occurrence=600.0) is Outcome.RAN
    # The start record, written with the claim, already names the grant.
    [running] = while_running
    assert (running.outcome, running.fence) == (RunOutcome.RUNNING, held[0])
    [ran] = await locks.store.runlog.runs("fenced")
    assert (ran.outcome, ran.fence) == (RunOutcome.RAN, held[0])
    assert await scheduler.tasks.run("fenced") is Outcome.RAN  # by hand
    manual, _ = await locks.store.runlog.runs("fenced")
    assert manual.fire_time is None and manual.fence == held[1] > held[0]
    busy = await other.acquire("fenced", ttl=5)
    assert busy is not None
    assert await scheduler.tasks.run("fenced", occurrence=660.0) is Outcome.SKIPPED
    skipped = (await locks.store.runlog.runs("fenced"))[0]
    assert (skipped.outcome, skipped.fence) == (RunOutcome.SKIPPED, None), "it held none"
    await busy.release()


async def test_contention_is_skipped_silently(
    scheduler: Scheduler,
    locks: LockService,
    other: LockService,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler.add(noop, "* * * * *", name="busy")
    held = await other.acquire("busy", ttl=2)
    assert held is not None
    with caplog.at_level(logging.DEBUG, logger="tenure"):
        assert await scheduler.tasks.run("busy") is Outcome.SKIPPED
    assert scheduler.tasks.counts[RunOutcome.SKIPPED] == 1
    levels = {r.levelno for r in caplog.records if "busy" in r.getMessage()}
    assert levels == {logging.DEBUG}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    [record] = await locks.store.runlog.runs("busy")
    assert record.outcome == "skipped"


async def test_an_occurrence_is_claimed_once(locks: LockService, other: LockService) -> None:
    runs: list[str] = []
    first, second = Scheduler(locks), Scheduler(other)
    for s, who in ((first, "first"), (second, "second")):
        s.add(lambda who=who: runs.append(who), "* * * * *", name="once")
    assert await first.tasks.run("once", occurrence=600.0) is Outcome.RAN
    assert await second.tasks.run("once", occurrence=600.0) is Outcome.SKIPPED
    assert await second.tasks.run("once", occurrence=540.0) is Outcome.SKIPPED, "no going back"
    assert await second.tasks.run("once", occurrence=660.0) is Outcome.RAN
    assert runs == ["first", "second"]
    assert second.tasks.counts["claimed_elsewhere"] == 2
    assert len(await locks.store.runlog.runs("once")) == 2, (
        "only runs are recorded, not lost claims"
    )


async def test_failures_are_recorded_and_raised(scheduler: Scheduler, locks: LockService) -> None:
    def broken() -> None:
        raise RuntimeError("disk full")

    scheduler.add(broken, "* * * * *", name="broken")
    with pytest.raises(RuntimeError, match="disk full"):
        await scheduler.tasks.run("broken", occurrence=60.0)
    [record] = await locks.store.runlog.runs("broken")
    assert record.outcome == "failed"
    assert record.fire_time == 60.0
    assert record.error == "RuntimeError: disk full"
    assert await locks.acquire("broken", ttl=1) is not None, "the lock was released"


async def test_plain_functions_run_in_a_thread(scheduler: Scheduler) -> None:
    threads: list[int] = []
    scheduler.add(lambda: threads.append(threading.get_ident()), "* * * * *", name="sync")
    assert await scheduler.tasks.run("sync") is Outcome.RAN
    assert threads
    assert threads[0] != threading.get_ident()


async def test_records_are_kept_up_to_the_retention_limit(locks: LockService) -> None:
    scheduler = Scheduler(locks, keep_runs=3)
    scheduler.add(noop, "* * * * *", name="kept")
    for i in range(6):
        await scheduler.tasks.run("kept", occurrence=60.0 * (i + 1))
    records = await locks.store.runlog.runs("kept")
    assert [r.fire_time for r in records] == [360.0, 300.0, 240.0]


async def test_prune_is_a_scheduled_task_that_keeps_fencing(locks: LockService) -> None:
    scheduler = Scheduler(locks, keep_runs=2)
    assert "tenure.prune" in scheduler.tasks
    scheduler.add(noop, "* * * * *", name="p")
    for i in range(4):
        await scheduler.tasks.run("p", occurrence=60.0 * (i + 1))
    lock = await locks.acquire("pruned-name", ttl=1)
    assert lock is not None
    await lock.release()
    assert await locks.store.acquire("expired-name", "e" * 32, 0.5, "gone") is not None
    await asyncio.sleep(lapse(locks.store, 0.5))
    assert await scheduler.tasks.run("tenure.prune", occurrence=600.0) is Outcome.RAN
    assert len(await locks.store.runlog.runs("p")) == 2
    again = await locks.acquire("pruned-name", ttl=1)
    assert again is not None
    assert again.fencing_token > lock.fencing_token
    assert await locks.store.holders("expired-name") == []


def test_prune_can_be_turned_off(locks: LockService) -> None:
    assert "tenure.prune" not in Scheduler(locks, prune=None).tasks


async def test_a_lost_lock_is_recorded_as_lost(scheduler: Scheduler, locks: LockService) -> None:
    from tenure import LockLost, current_lock

    async def vanishing() -> None:
        lock = current_lock()
        await locks.store.release(lock.name, lock.token)  # the lease is gone from under it
        await asyncio.sleep(30)

    scheduler.add(vanishing, "* * * * *", name="vanishing", ttl=1)
    with pytest.raises(LockLost):
        await asyncio.wait_for(scheduler.tasks.run("vanishing", occurrence=60.0), 10)
    [record] = await locks.store.runlog.runs("vanishing")
    assert record.outcome == RunOutcome.LOST
    assert record.error is not None
    assert "lost" in record.error
    assert scheduler.tasks.counts[RunOutcome.LOST] == 1


def test_intervals_count_from_the_unix_epoch() -> None:
    from tenure.schedule.interval import IntervalSchedule

    quarter = IntervalSchedule(900)
    assert quarter.expr == "every 15m" and str(quarter.tz) == "UTC"
    t = 1_700_000_123.4  # 2023-11-14 22:15:23.4 UTC
    assert quarter.next_after(t) == 1_700_000_100 + 900
    assert quarter.latest_at_or_before(t) == 1_700_000_100
    assert quarter.next_after(1_700_000_100) == 1_700_001_000, "strictly after"
    assert quarter.latest_at_or_before(1_700_000_100) == 1_700_000_100, "at or before"
    tenth = IntervalSchedule(0.1)  # division rounds; the fire times still step exactly
    fire = 1_700_000_000.0
    for _ in range(50):
        following = tenth.next_after(fire)
        assert fire < following <= fire + 0.1 + 1e-6
        assert tenth.latest_at_or_before(following) == following
        fire = following
    assert IntervalSchedule(5400).expr == "every 1h30m"
    assert IntervalSchedule(45).expr == "every 45s"


def test_every_registers_an_interval_task(scheduler: Scheduler) -> None:
    @scheduler.every(minutes=1, seconds=30, name="sweep")
    async def sweep() -> None: ...

    task = scheduler.tasks["sweep"]
    assert task.schedule.expr == "every 1m30s"
    assert task.schedule.next_after(90.0) == 180.0
    scheduler.add(noop, every=2, name="added")
    assert scheduler.tasks["added"].schedule.next_after(3) == 4


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"seconds": 0}, "needs a positive interval"),
        ({"seconds": -5}, r"every\(seconds=...\) must be finite and not negative, got -5"),
        ({"minutes": float("inf")}, r"every\(minutes=...\) must be finite"),
        ({"hours": float("nan")}, r"every\(hours=...\) must be finite"),
        ({"seconds": "30"}, r"every\(seconds=...\) must be a number, got '30'"),
    ],
)
def test_bad_intervals_fail_at_registration(
    scheduler: Scheduler, kwargs: dict[str, object], says: str
) -> None:
    before = len(scheduler.tasks)
    with pytest.raises(InvalidArgument, match=says):
        scheduler.every(**kwargs)(noop)  # type: ignore[arg-type]
    assert len(scheduler.tasks) == before


def test_an_interval_and_a_cron_expression_do_not_mix(scheduler: Scheduler) -> None:
    before = len(scheduler.tasks)
    with pytest.raises(
        InvalidArgument, match="either a cron expression or every=SECONDS, got both"
    ):
        scheduler.add(noop, "* * * * *", every=30, name="both")
    with pytest.raises(InvalidArgument, match="got neither"):
        scheduler.add(noop, name="neither")
    with pytest.raises(InvalidArgument, match="tz='Europe/Berlin' has no meaning for every="):
        scheduler.add(noop, every=30, tz="Europe/Berlin", name="zoned")
    scheduler.add(noop, every=30, name="twice")
    with pytest.raises(InvalidArgument, match="already registered"):
        scheduler.every(seconds=30, name="twice")(noop)
    assert len(scheduler.tasks) == before + 1


async def test_an_interval_occurrence_runs_once_across_instances() -> None:
    from tenure.stores.memory import MemoryStore

    store = MemoryStore()
    ran: list[tuple[float, int]] = []
    schedulers = []
    for index in range(3):
        scheduler = Scheduler(LockService(store), prune=None)

        def make(i: int) -> object:
            async def half() -> None:
                fire = current_run().fire_time
                assert fire is not None
                ran.append((fire, i))

            return half

        scheduler.add(make(index), every=0.5, name="half")  # type: ignore[arg-type]
        schedulers.append(scheduler)
    serving = [asyncio.ensure_future(s.serve()) for s in schedulers]
    await asyncio.sleep(3.2)
    for scheduler in schedulers:
        scheduler.stop()
    await asyncio.gather(*serving)
    fires = sorted(fire for fire, _ in ran)
    assert len(fires) >= 5
    assert len(fires) == len(set(fires)), "each occurrence once"
    assert all(fire * 2 == int(fire * 2) for fire in fires), "on the half seconds"
    assert fires == [fires[0] + 0.5 * i for i in range(len(fires))], "none missing"
