"""Abandoned runs on every store: a ``running`` record outlives its instance only
until that instance's presence lease runs out, then reads (and is stored as)
``abandoned``."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from tenure import LockService, RunRecord, Scheduler
from tenure.stores.runlog import presence_name


def _running(run_id: str, instance: str, started: float) -> RunRecord:
    return RunRecord(run_id, "job", started, instance, started, None, "running")


async def test_a_running_record_reads_abandoned_once_its_instance_is_gone(
    locks: LockService,
) -> None:
    store = locks.store
    now = time.time()
    alive = await locks.acquire(presence_name("host:1:alive"), ttl=5)
    assert alive is not None
    # "dead" held its presence lease once: it runs out under the records.
    assert await store.acquire(presence_name("host:2:dead"), "d" * 32, 0.6, "host:2:dead")
    records = [
        _running("of-alive", "host:1:alive", now),
        _running("of-dead", "host:2:dead", now + 1),
        RunRecord("done", "job", now + 2, "host:2:dead", now + 2, now + 3, "ran"),
    ]
    await store.runlog.record_runs(records, keep=10)
    assert {r.run_id: r.outcome for r in await store.runlog.runs("job")} == {
        "of-alive": "running",
        "of-dead": "running",
        "done": "ran",
    }
    for _ in range(150):  # etcd may take a second or two past the TTL
        read = {r.run_id: r for r in await store.runlog.runs("job")}
        if read["of-dead"].outcome != "running":
            break
        await asyncio.sleep(0.1)
    assert read["of-dead"].outcome == "abandoned"
    assert read["of-dead"].ended is None, "when its lease ran out is for the prune to say"
    assert "its instance host:2:dead stopped renewing its presence lease" in str(
        read["of-dead"].error
    )
    assert read["of-alive"].outcome == "running"
    assert read["done"].outcome == "ran"
    # As stored, nothing changed: reading wrote nothing.
    stored = {r.run_id: r.outcome for r in await store.runlog.stored_runs("job")}
    assert stored == {"of-alive": "running", "of-dead": "running", "done": "ran"}


async def test_store_abandoned_writes_only_records_that_still_say_running(
    locks: LockService,
) -> None:
    store = locks.store
    now = time.time()
    records = [_running(f"r{i}", "host:3:gone", now + i) for i in range(3)]
    await store.runlog.record_runs(records, keep=10)
    # r1's own final record arrives first: it is never overwritten.
    finished = dataclasses.replace(records[1], ended=now + 5, outcome="ran")
    await store.runlog.record_run(finished, keep=10)
    gone = [
        dataclasses.replace(r, outcome="abandoned", ended=now + 9, error="gone")
        for r in [*records, _running("never-written", "host:3:gone", now)]
    ]
    assert await store.runlog.store_abandoned(gone) == 2
    stored = {r.run_id: r for r in await store.runlog.stored_runs("job")}
    assert {k: r.outcome for k, r in stored.items()} == {
        "r0": "abandoned",
        "r1": "ran",
        "r2": "abandoned",
    }
    assert stored["r0"].ended == now + 9 and stored["r0"].error == "gone"
    assert stored["r1"] == finished
    assert await store.runlog.store_abandoned(gone) == 0, "done once: nothing says running now"


async def test_a_scheduler_holds_its_presence_and_its_runs_read_running(
    locks: LockService,
) -> None:
    scheduler = Scheduler(locks, prune=None, presence_ttl=1)
    inside = asyncio.Event()
    leave = asyncio.Event()

    @scheduler.cron("* * * * *", name="job")
    async def job() -> None:
        inside.set()
        await leave.wait()

    running = asyncio.ensure_future(scheduler.tasks.run("job"))
    await asyncio.wait_for(inside.wait(), 10)
    assert await scheduler.tasks.presence.ready(10)
    holder = await locks.store.holder_of(presence_name(locks.holder))
    assert holder is not None and holder.holder == locks.holder
    await asyncio.sleep(1.5)  # past the presence TTL: the renewer keeps it
    [record] = await locks.store.runlog.runs("job")
    assert record.outcome == "running"
    assert await scheduler.tasks.store_abandoned() == 0
    leave.set()
    assert await running == "ran"
    [record] = await locks.store.runlog.runs("job")
    assert record.outcome == "ran"
