"""Many tasks due at the same second: every occurrence runs exactly once.

Counts, never times. 1,000 every-second tasks on three processes, on every
shared store; 200 on one instance of the in-process memory store (an ordinary
cron table's ``0 * * * *`` lines all fall due together), for a few seconds.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tenure import LockService, Scheduler
from tenure.stores import from_url

ROOT = Path(__file__).resolve().parents[2]

TASKS = 200
SECONDS = 3.5


async def test_two_hundred_tasks_due_together_each_run_once_in_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The memory store's case: it cannot be shared by three processes."""
    url = "memory://"
    caplog.set_level(logging.INFO, logger="tenure")
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
        # Start just past a whole second, so that the scheduler is up well
        # before the first occurrence the window counts.
        await asyncio.sleep(1.05 - time.time() % 1.0)
        serving = asyncio.ensure_future(scheduler.serve())
        await asyncio.sleep(SECONDS)
        scheduler.stop()
        await asyncio.wait_for(serving, 60)
        stopped = time.time()

    # Every occurrence from the first the scheduler said it would serve (it
    # does not backfill what fell due while it started) to the last its
    # timer loop surely reached before the stop.
    first = first_due(caplog.records)
    due = [float(t) for t in range(int(first), int(stopped - 1.5) + 1)]
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


def first_due(records: list[logging.LogRecord]) -> float:
    """The first fire time a scheduler's "serving" log line announced."""
    said = [r for r in records if r.getMessage().startswith("serving ")]
    assert said, "the scheduler did not say what it serves"
    assert isinstance(said[0].args, tuple)
    when = datetime.strptime(str(said[0].args[-1]), "%Y-%m-%d %H:%M:%S")
    return when.replace(tzinfo=UTC).timestamp()


INSTANCES = 3
MANY = 1000
WINDOW = 6.0


async def test_a_thousand_every_second_tasks_on_three_instances_run_once_in_batches(
    shared_url: str,
) -> None:
    """1,000 tasks every second on three processes: every occurrence runs once,
    none is missed, and each instance's store calls per tick stay within a
    small constant times ceil(due tasks / the store's batch size)."""
    start = time.time() + 4.0  # each process imports, connects and registers first
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "bench" / "scheduler_instance.py"),
            shared_url,
            str(MANY),
            repr(start),
            repr(WINDOW),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(INSTANCES)
    ]
    results = []
    for proc in procs:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        results.append(json.loads(out))

    runs: collections.Counter[tuple[float, int]] = collections.Counter()
    for result in results:
        for fire, indices in result["ran"].items():
            runs.update((float(fire), i) for i in indices)
        outcomes = result["outcomes"]
        late = sorted(lateness for _, lateness in result["late"]) or [0.0]
        assert set(outcomes) <= {"ran", "claimed_elsewhere"}, (
            f"{outcomes}; lateness p50 {late[len(late) // 2]:.3f} s, max {late[-1]:.3f} s, "
            f"store calls {result['store_calls']}"
        )
    # The occurrences every instance surely reached: from the first whole
    # second after the start to two before the stop.
    due = [float(t) for t in range(math.ceil(start) + 1, int(start + WINDOW) - 1)]
    assert len(due) >= 3
    for fire in due:
        counts = [runs[(fire, i)] for i in range(MANY)]
        assert counts == [1] * MANY, (
            f"occurrence {fire}: {counts.count(0)} of {MANY} tasks never ran, "
            f"{sum(n > 1 for n in counts)} ran more than once"
        )
    assert max(runs.values()) == 1, "an occurrence ran twice"

    store = from_url(shared_url)
    batch = store.batch_max
    await store.aclose()
    for result in results:
        ticks = result["ticks"]
        assert ticks >= len(due)
        calls = sum(result["store_calls"].values())
        # Three steps (start: claim, lock and start record, itself up to three
        # store calls on the stores without a combined step; release; end
        # record), at most five calls, each split in at most two batches when
        # its items arrive a turn apart.
        bound = ticks * math.ceil(MANY / batch) * 5 * 2
        assert calls <= bound, (result["store_calls"], ticks)
