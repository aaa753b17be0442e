"""Many tasks due at the same second on one instance: every occurrence runs exactly once.

Counts, never times: 200 every-second tasks (an ordinary cron table's
``0 * * * *`` lines all fall due together) for a few seconds, on every store.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable

from tenure import LockService, Scheduler

TASKS = 200
SECONDS = 3.5


async def test_two_hundred_tasks_due_together_each_run_once(url: str) -> None:
    events: collections.Counter[tuple[str, float, str]] = collections.Counter()

    def listener(task: str, occurrence: float | None, outcome: str) -> None:
        assert occurrence is not None
        events[(task, occurrence, str(outcome))] += 1

    async with LockService.from_url(url) as locks:
        scheduler = Scheduler(locks, prune=None, listener=listener)
        ran: collections.Counter[str] = collections.Counter()
        for i in range(TASKS):

            def make(name: str) -> Callable[[], Awaitable[None]]:
                async def task() -> None:
                    ran[name] += 1

                return task

            scheduler.add(make(f"t{i}"), "* * * * * *", name=f"t{i}")
        started = time.time()
        serving = asyncio.ensure_future(scheduler.serve())
        await asyncio.sleep(SECONDS)
        scheduler.stop()
        await asyncio.wait_for(serving, 60)
        stopped = time.time()

    # Every occurrence the timer loop surely reached before the stop.
    due = [float(t) for t in range(int(started) + 1, int(stopped - 1.5) + 1)]
    assert len(due) >= 2, "the window held too few occurrences to judge"
    outcomes = collections.Counter(outcome for (_, _, outcome) in events)
    assert set(outcomes) <= {"ran"}, f"every outcome should be ran: {outcomes}"
    for fire in due:
        runs = [events[(f"t{i}", fire, "ran")] for i in range(TASKS)]
        assert runs == [1] * TASKS, (
            f"occurrence {fire}: {runs.count(0)} of {TASKS} tasks never ran, "
            f"{sum(n > 1 for n in runs)} ran more than once"
        )
    assert sum(ran.values()) == sum(events.values())
