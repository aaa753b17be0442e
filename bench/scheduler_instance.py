"""One instance of a scheduler with many every-second tasks (bench/load.py and tests/load).

    python bench/scheduler_instance.py URL TASKS START SECONDS [apscheduler]

Registers TASKS tasks ``t0``..``tN`` on ``* * * * * *``, waits until the
POSIX time START, serves for SECONDS, then prints one JSON line:

* ``ran``: ``{fire_time: [task indices]}`` of the runs this instance made;
* ``late``: ``[fire_time, lateness]`` of each run, seconds: when the task's
  first line ran minus its occurrence's fire time (``tenure.current_run()``);
* ``outcomes``: the scheduler's counts by outcome;
* ``store_calls``: the scheduler's store calls by step, and ``ticks``: the
  fire times it reached;
* ``cpu``: CPU seconds this process used while serving, and ``wall``.

With ``apscheduler`` it runs the same jobs in APScheduler 3 instead (one
process, not cluster-safe: the side-by-side figure).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tenure import LockService, Scheduler, current_run


def _cpu() -> float:
    times = os.times()
    return float(times.user + times.system)


async def tenure_instance(url: str, tasks: int, start: float, seconds: float) -> dict[str, object]:
    ran: dict[float, list[int]] = collections.defaultdict(list)
    late: list[tuple[float, float]] = []
    ticks: set[float] = set()

    def listener(task: str, occurrence: float | None, outcome: str) -> None:
        if occurrence is not None:
            ticks.add(occurrence)

    async with LockService.from_url(url) as locks:
        scheduler = Scheduler(locks, prune=None, listener=listener)
        for i in range(tasks):

            def make(index: int) -> Callable[[], Awaitable[None]]:
                async def task() -> None:
                    run = current_run()
                    assert run.fire_time is not None
                    late.append((run.fire_time, time.time() - run.fire_time))
                    ran[run.fire_time].append(index)

                return task

            scheduler.add(make(i), "* * * * * *", name=f"t{i}")
        await asyncio.sleep(max(0.0, start - time.time()))
        cpu, wall = _cpu(), time.monotonic()
        serving = asyncio.ensure_future(scheduler.serve())
        await asyncio.sleep(seconds)
        scheduler.stop()
        await asyncio.wait_for(serving, 60)
        cpu, wall = _cpu() - cpu, time.monotonic() - wall
        return {
            "ran": {repr(fire): indices for fire, indices in ran.items()},
            "late": late,
            "outcomes": dict(scheduler.tasks.counts),
            "store_calls": dict(scheduler.tasks.store_calls),
            "ticks": len(ticks),
            "cpu": cpu,
            "wall": wall,
        }


async def apscheduler_instance(tasks: int, start: float, seconds: float) -> dict[str, object]:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    ran: dict[float, list[int]] = collections.defaultdict(list)
    late: list[tuple[float, float]] = []
    scheduler = AsyncIOScheduler(timezone="UTC")
    for i in range(tasks):

        async def job(index: int = i) -> None:
            now = time.time()
            fire = float(int(now))  # every second, on the second: the due time
            late.append((fire, now - fire))
            ran[fire].append(index)

        scheduler.add_job(job, "cron", second="*", id=f"t{i}", misfire_grace_time=30)
    await asyncio.sleep(max(0.0, start - time.time()))
    cpu, wall = _cpu(), time.monotonic()
    scheduler.start()
    await asyncio.sleep(seconds)
    scheduler.shutdown(wait=False)
    cpu, wall = _cpu() - cpu, time.monotonic() - wall
    return {
        "ran": {repr(fire): indices for fire, indices in ran.items()},
        "late": late,
        "cpu": cpu,
        "wall": wall,
    }


def main() -> None:
    url, tasks, start, seconds = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        float(sys.argv[4]),
    )
    if sys.argv[5:] == ["apscheduler"]:
        result = asyncio.run(apscheduler_instance(tasks, start, seconds))
    else:
        result = asyncio.run(tenure_instance(url, tasks, start, seconds))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
