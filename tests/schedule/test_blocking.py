"""tenure.sync.Scheduler: the asyncio scheduler run for blocking code."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tenure
from tenure import InvalidArgument, RunOutcome
from tenure.stores.memory import MemoryStore
from tenure.sync import LockService, Scheduler, current_run

from ..helpers.procs import ROOT


def test_with_serves_plain_and_async_tasks_and_stops() -> None:
    locks = LockService(MemoryStore())
    scheduler = Scheduler(locks, prune=None)
    seen: list[tuple[str, float | None, str]] = []

    @scheduler.every(seconds=0.5, name="plain")
    def plain() -> None:
        seen.append(("plain", current_run().fire_time, threading.current_thread().name))

    @scheduler.cron("* * * * * *", name="async")
    async def coroutine() -> None:
        seen.append(("async", current_run().fire_time, threading.current_thread().name))

    with scheduler:
        with pytest.raises(InvalidArgument, match="already serving"):
            scheduler.start()
        time.sleep(2.3)
    kinds = {kind for kind, _, _ in seen}
    assert kinds == {"plain", "async"}, seen
    assert all(fire is not None for _, fire, _ in seen)
    assert {thread for kind, _, thread in seen if kind == "plain"} <= {
        f"tenure-task_{i}" for i in range(8)
    }, "plain functions on the scheduler's worker threads"
    count = len(seen)
    time.sleep(1.2)
    assert len(seen) == count, "stopped: nothing fires after the block"
    records = asyncio.run(locks.store.runlog.runs("plain"))
    assert records and all(r.outcome == RunOutcome.RAN for r in records)
    scheduler.stop()  # not serving: nothing to do
    locks.close()


def test_it_takes_a_blocking_service_only() -> None:
    with pytest.raises(InvalidArgument, match=r"needs a tenure\.sync\.LockService"):
        Scheduler(tenure.LockService(MemoryStore()))  # type: ignore[arg-type]


def test_two_processes_share_each_occurrence(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/two.db"
    script = f"""
import time
from tenure.sync import LockService, Scheduler, current_run

locks = LockService.from_url({url!r})
scheduler = Scheduler(locks, prune=None)

@scheduler.every(seconds=0.5, name="half")
def half() -> None:
    print(current_run().fire_time, flush=True)

with scheduler:
    time.sleep(3)
locks.close()
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    fires = sorted(float(line) for out in outputs for line in out.split())
    assert len(fires) >= 4
    assert len(fires) == len(set(fires)), "each occurrence once"
    assert fires == [fires[0] + 0.5 * i for i in range(len(fires))], "none missing"


def test_serve_stops_gracefully_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/serve.db"
    script = f"""
import time
from tenure.sync import LockService, Scheduler

locks = LockService.from_url({url!r})
scheduler = Scheduler(locks, prune=None)

@scheduler.cron("* * * * * *", name="slow")
def slow() -> None:
    print("started", flush=True)
    time.sleep(0.6)

scheduler.serve()
print("served", flush=True)
locks.close()
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"  # a run is in progress
    terminated = time.time()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "served" and "Traceback" not in err

    async def records() -> list[tenure.RunRecord]:
        async with tenure.LockService.from_url(url) as service:
            return await service.store.runlog.runs("slow")

    [record] = asyncio.run(records())
    assert record.outcome == RunOutcome.RAN, "it finished its run"
    assert record.ended is not None and record.ended > terminated
