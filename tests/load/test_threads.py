"""Plain functions run on bounded worker threads; past the bound, a clear refusal.

The pools are the service's and the scheduler's, whatever the store: these
tests use the memory store.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from tenure import InvalidArgument, LockService, PoolFull, RunOutcome, Scheduler

from ..helpers.until import until


def _url() -> str:
    return f"memory://threads-{uuid.uuid4().hex}"


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "8", None])
async def test_bad_thread_bounds_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="threads must be a whole number"):
        LockService.from_url(_url(), threads=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="thread_queue must be a whole number"):
        LockService.from_url(_url(), thread_queue=bad)  # type: ignore[arg-type]
    async with LockService.from_url(_url()) as locks:
        with pytest.raises(InvalidArgument, match="threads must be a whole number"):
            Scheduler(locks, threads=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="thread_queue must be a whole number"):
            Scheduler(locks, thread_queue=bad)  # type: ignore[arg-type]


async def test_run_exclusively_runs_at_most_threads_at_once_and_refuses_past_the_queue() -> None:
    gate = threading.Event()
    running = 0
    peak = 0
    count_guard = threading.Lock()

    def work() -> None:
        nonlocal running, peak
        with count_guard:
            running += 1
            peak = max(peak, running)
        gate.wait(10)
        with count_guard:
            running -= 1

    url = _url()
    async with (
        LockService.from_url(url, threads=2, thread_queue=1) as locks,
        LockService.from_url(url) as other,
    ):
        runs = [asyncio.ensure_future(locks.run_exclusively(f"job{i}", work)) for i in range(3)]
        await until(lambda: locks.threads.pending == 3, "two on threads, one waiting for one")
        with pytest.raises(PoolFull, match=r"threads=2, thread_queue=1"):
            await locks.run_exclusively("job3", work)
        # Refused before its lock was taken.
        assert await other.acquire("job3") is not None
        gate.set()
        assert await asyncio.gather(*runs) == ["ran", "ran", "ran"]
    assert peak == 2, "at most two plain functions ran at once, and two did"


async def test_an_occurrence_past_the_schedulers_thread_queue_ends_missed() -> None:
    gate = threading.Event()
    started: list[str] = []

    def make(name: str) -> object:
        def task() -> None:
            started.append(name)
            gate.wait(10)

        return task

    async with LockService.from_url(_url()) as locks:
        scheduler = Scheduler(locks, prune=None, threads=1, thread_queue=1)
        for name in ("a", "b", "c"):
            scheduler.add(make(name), "* * * * *", name=name)  # type: ignore[arg-type]
        occurrence = float(int(time.time()))
        runs = [
            asyncio.ensure_future(scheduler.tasks.run(name, occurrence=occurrence))
            for name in ("a", "b")
        ]
        await until(
            lambda: scheduler.tasks.threads.pending == 2, "one running, one waiting for the thread"
        )
        assert await scheduler.tasks.run("c", occurrence=occurrence) == "skipped"
        gate.set()
        assert await asyncio.gather(*runs) == ["ran", "ran"]
        assert sorted(started) == ["a", "b"]
        [record] = await locks.store.runlog.runs("c")
        assert record.outcome == RunOutcome.MISSED
        assert record.error is not None and "thread pool full" in record.error
        assert scheduler.tasks.counts[RunOutcome.MISSED] == 1
        assert await locks.store.holder_of("c") is None, "the missed occurrence took no lock"
