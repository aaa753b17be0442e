"""An occurrence whose store fails: retried within the misfire grace, then `missed`."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tenure import LockService, RunOutcome, RunRecord, Scheduler

from ..conftest import StoreKind
from ..helpers.proxied import proxied


async def test_an_occurrence_the_store_fails_past_the_grace_ends_missed(
    shared_kind: StoreKind, shared_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with LockService.from_url(shared_url) as locks:
        scheduler = Scheduler(locks, prune=None, misfire_grace=0.5)
        ran: list[float] = []

        @scheduler.cron("* * * * *", name="nightly")
        async def nightly() -> None:
            ran.append(time.time())

        await locks.store.runlog.runs("nightly")  # connected (and tables made) before the outage
        # This instance's presence lease taken before it too (serve() takes it first).
        assert await scheduler.tasks.presence.ready(10)
        occurrence = float(int(time.time()))
        caplog.set_level(logging.DEBUG, logger="tenure")
        started = time.monotonic()
        with shared_kind.outage(locks.store):
            running = asyncio.ensure_future(scheduler.tasks.run("nightly", occurrence=occurrence))
            await asyncio.sleep(2.5)
        outcome = await asyncio.wait_for(running, 30)
        assert time.monotonic() - started >= 2.5, "the outage lasted past the grace"
        assert outcome == "skipped" and ran == []
        assert scheduler.tasks.counts[RunOutcome.MISSED] == 1
        await scheduler.tasks.flush_missed(10)  # its record is written once the store is back
        records = await locks.store.runlog.runs("nightly")
        assert [(r.fire_time, r.outcome) for r in records] == [(occurrence, "missed")]
        assert records[0].error is not None and "misfire grace" in records[0].error
        said = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("tenure")
        ]
        assert len(said) == 1, [r.getMessage() for r in said]
        assert "missed" in said[0].getMessage() and said[0].exc_info is None
        # The next occurrence, with the store back, runs as usual.
        assert await scheduler.tasks.run("nightly", occurrence=occurrence + 60) == "ran"
        assert len(ran) == 1


async def test_occurrences_missed_while_the_store_fails_merge_into_one_record(
    shared_kind: StoreKind, shared_url: str
) -> None:
    """Each missed occurrence is counted and told, but a task's misses while its
    record cannot be written merge into that one record; it is written once the
    store is back, and a stopping scheduler waits for it."""
    async with LockService.from_url(shared_url) as locks:
        scheduler = Scheduler(locks, prune=None, misfire_grace=0.2)

        @scheduler.cron("* * * * *", name="often")
        async def often() -> None: ...

        await locks.store.runlog.runs("often")  # connected (and tables made) before the outage
        assert await scheduler.tasks.presence.ready(10)  # taken before it too
        first = float(int(time.time()) // 60 * 60)
        occurrences = [first + 60 * k for k in range(4)]
        with shared_kind.outage(locks.store):
            await asyncio.sleep(0.3)  # every occurrence is past its grace at once
            # Latest first: the record still starts at the earliest miss.
            outcomes = await asyncio.gather(
                *(
                    scheduler.tasks.run("often", occurrence=t - 60 * 4)
                    for t in reversed(occurrences)
                )
            )
        assert outcomes == ["skipped"] * 4
        counts = scheduler.tasks.counts
        assert counts[RunOutcome.MISSED] == 4 and counts["missed_merged"] == 3
        await scheduler.tasks.flush_missed(10)
        [record] = await locks.store.runlog.runs("often")
        assert record.outcome == "missed" and record.fire_time == occurrences[0] - 240
        assert record.error is not None and record.error.startswith("missed 4 occurrences from ")


async def test_a_manual_run_is_not_retried(shared_kind: StoreKind, shared_url: str) -> None:
    """Without an occurrence there is no grace: the caller sees the store's error."""
    from tenure import StoreUnavailable

    async with LockService.from_url(shared_url) as locks:
        scheduler = Scheduler(locks, prune=None)

        @scheduler.cron("* * * * *", name="by-hand")
        async def by_hand() -> None: ...

        await locks.store.runlog.runs("by-hand")
        assert await scheduler.tasks.presence.ready(10)  # taken before the outage
        with shared_kind.outage(locks.store), pytest.raises(StoreUnavailable):
            await scheduler.tasks.run("by-hand")
        assert scheduler.tasks.counts[RunOutcome.MISSED] == 0


@pytest.mark.parametrize("store", ["redis", "postgres"])
async def test_a_claim_whose_answer_was_lost_is_still_this_instances(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store commits the start (claim, lock, start record), its answer
    never arrives, the start is sent again: the occurrence is this instance's
    and runs (it is not lost as "claimed elsewhere")."""
    with proxied(store) as (_, through, proxy):
        async with LockService.from_url(through) as locks:
            scheduler = Scheduler(locks, prune=None)
            ran: list[float] = []

            @scheduler.cron("* * * * *", name="job")
            async def job() -> None:
                ran.append(time.time())

            # Connected, tables made, the start's script loaded or statement
            # prepared first (an earlier occurrence): under the mute only the
            # start itself runs.
            occurrence = float(int(time.time()))
            assert await scheduler.tasks.run("job", occurrence=occurrence - 60) == "ran"
            ran.clear()
            assert await scheduler.tasks.presence.ready(10)
            caplog.set_level(logging.DEBUG, logger="tenure")
            proxy.set_mode("mute")
            running = asyncio.ensure_future(scheduler.tasks.run("job", occurrence=occurrence))
            # Muted until the claim itself timed out (other connections, such as
            # the renewer's warming up, may lose answers too: not enough).
            for _ in range(1000):
                if any("starting it failed" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
            proxy.set_mode("pass")
            outcome = await asyncio.wait_for(running, 30)
            assert proxy.dropped > 0, "an answer of the store was lost"
            tried_again = [r for r in caplog.records if "starting it failed" in r.getMessage()]
            assert tried_again, "the claim was sent again after its answer was lost"
            assert outcome == "ran" and len(ran) == 1
            assert scheduler.tasks.counts["claimed_elsewhere"] == 0
            records = await locks.store.runlog.runs("job")
            assert [(r.fire_time, r.outcome) for r in records] == [
                (occurrence, "ran"),
                (occurrence - 60, "ran"),
            ]


async def test_a_start_whose_answer_was_lost_and_then_missed_leaves_no_running_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An occurrence's start commits (claim, lock and a ``running`` record),
    its answer is lost, and so is every retry's, past the misfire grace: the
    occurrence ends ``missed``, and its missed record replaces the start
    record, so that none reads ``running`` while this instance lives on."""
    with proxied("redis") as (direct, through, proxy):
        async with LockService.from_url(through) as locks, LockService.from_url(direct) as other:
            scheduler = Scheduler(locks, prune=None, misfire_grace=2)

            @scheduler.cron("* * * * *", name="job")
            async def job() -> None: ...

            occurrence = float(int(time.time()))  # retried for the grace from now on
            assert await scheduler.tasks.run("job", occurrence=occurrence - 60) == "ran"  # warm
            assert await scheduler.tasks.presence.ready(10)
            caplog.set_level(logging.DEBUG, logger="tenure")
            # Muted throughout: the start and each retry reach the store and
            # are applied there; no answer comes back.
            proxy.set_mode("mute")
            running = asyncio.ensure_future(scheduler.tasks.run("job", occurrence=occurrence))
            said = f"occurrence {occurrence}: starting it failed"
            for _ in range(1000):
                if any(said in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
            stored = await other.store.runlog.stored_runs("job")
            assert [r.outcome for r in stored if r.fire_time == occurrence] == ["running"], (
                "the start committed in the store"
            )
            assert await asyncio.wait_for(running, 30) == "skipped"
            proxy.set_mode("pass")
            assert proxy.dropped > 0, "an answer of the store was lost"
            assert scheduler.tasks.counts[RunOutcome.MISSED] == 1
            await scheduler.tasks.flush_missed(10)
            records = await other.store.runlog.runs("job")
            assert [(r.fire_time, r.outcome) for r in records] == [
                (occurrence, "missed"),
                (occurrence - 60, "ran"),
            ], [(r.fire_time, r.outcome, r.error) for r in records]


async def test_a_missed_start_merged_into_another_closes_its_own_record() -> None:
    """``MissedRecords``: of two missed occurrences of one task whose starts
    may have written ``running`` records, the first one's record replaces its
    own; the second merges into it and closes its own where it says running."""
    from tenure.schedule._missed import MissedRecords
    from tenure.stores.memory import MemoryStore

    store = MemoryStore("missed-close")

    def record(run_id: str, fire: float, outcome: str, error: str | None = None) -> RunRecord:
        ended = None if outcome == "running" else fire + 1
        return RunRecord(run_id, "job", fire, "host:1:me", fire, ended, outcome, error)

    await store.runlog.record_runs(
        [record("r1", 60.0, "running"), record("r2", 120.0, "running")], keep=10
    )

    async def write(records: list[RunRecord]) -> None:
        await store.runlog.record_runs(records, keep=10)

    missed = MissedRecords(write, store.runlog.store_abandoned, first_pause=0.01, most_pause=0.01)
    missed.add(record("r1", 60.0, "missed", "down"), maybe_started=True)
    missed.add(record("r2", 120.0, "missed", "down"), maybe_started=True)
    missed.add(record("r3", 180.0, "missed", "down"))  # its start surely wrote nothing
    await missed.flush(5)
    assert missed.merged == 2
    by_id = {r.run_id: r for r in await store.runlog.stored_runs("job")}
    assert set(by_id) == {"r1", "r2"}, "merged, r3 is written nowhere"
    assert by_id["r1"].outcome == "missed"
    assert (by_id["r1"].error or "").startswith("missed 3 occurrences")
    assert by_id["r2"].outcome == "missed" and by_id["r2"].error == "down"
