"""The scheduler across real processes: skewed clocks, SIGKILL of the running instance."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

from tenure import LockService, Scheduler

from ..helpers.procs import HELPERS, ROOT


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")


async def test_demo_three_skewed_instances_run_each_occurrence_once(shared_url: str) -> None:
    url = shared_url
    result = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "tenure",
            "demo",
            "--instances",
            "3",
            "--seconds",
            "5",
            "--skew",
            "0.4",
            "--url",
            url,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "-0.40 s, +0.00 s, +0.40 s" in result.stdout
    summary = re.search(
        r"occurrences: (\d+)  runs: (\d+)  duplicates: (\d+)  missing: (\d+)", result.stdout
    )
    assert summary is not None, result.stdout
    occurrences, runs, duplicates, missing = map(int, summary.groups())
    assert occurrences >= 3
    assert runs == occurrences
    assert duplicates == 0
    assert missing == 0
    # Independently of the demo's own count: the run records in the store.
    async with LockService.from_url(url) as locks:
        records = await locks.store.runlog.runs("demo.tick", limit=1000)
    by_fire = collections.Counter(r.fire_time for r in records if r.outcome == "ran")
    assert len(by_fire) == occurrences
    assert set(by_fire.values()) == {1}, "each occurrence ran exactly once"
    fires = sorted(f for f in by_fire if f is not None)
    assert fires == [fires[0] + i for i in range(len(fires))], "no occurrence missing"
    assert len({r.instance for r in records}) >= 1


def _start(url: str, work: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HELPERS / "cron_instance.py"), url, str(work)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def _read(proc: subprocess.Popen[str], timeout: float) -> dict[str, object]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from {proc.pid} in {timeout} s"
    line: dict[str, object] = json.loads(proc.stdout.readline())
    return line


async def test_sigkill_of_the_running_instance_lets_another_take_the_next_occurrence(
    shared_url: str,
) -> None:
    url = shared_url
    a = _start(url, work=60)
    b = None
    try:
        a_holder = _read(a, 30)["holder"]
        assert _read(a, 10) == {"started": True, "holder": a_holder}
        b = _start(url, work=0)
        b_holder = _read(b, 30)["holder"]
        await asyncio.sleep(2.0)  # b's occurrences find a's run holding the lock
        a.send_signal(signal.SIGKILL)
        a.wait()
        killed = time.time()
        started = _read(b, 10)
        assert started == {"started": True, "holder": b_holder}
        took_over = time.time() - killed
        assert took_over <= 1.0 + 1.0 + 0.5, took_over  # the TTL, the next second, a margin
        async with LockService.from_url(url) as locks:
            records = await locks.store.runlog.runs("job", limit=100)
        # While a ran, the occurrences were skipped by whichever instance claimed
        # them (a, being warm, may win every claim), and b ran none of them.
        skipped = [r for r in records if r.outcome == "skipped" and r.started < killed]
        assert skipped, "the occurrences during a's run were skipped: a held the lock"
        assert not any(
            r.instance == b_holder and r.outcome in ("ran", "running") and r.started < killed
            for r in records
        ), "b ran nothing while a held the lock"
        # a's run, and any occurrence a was in the middle of skipping when killed.
        dead = {r.run_id for r in records if r.instance == a_holder and r.ended is None}
        assert dead, "a died mid-run: its record was never closed"
        async with LockService.from_url(url) as locks:
            for _ in range(100):  # a's presence lease (1 s) may not have run out yet
                found = [r for r in await locks.store.runlog.runs("job", 100) if r.run_id in dead]
                if all(r.outcome != "running" for r in found):
                    break
                await asyncio.sleep(0.1)
            assert {r.outcome for r in found} == {"abandoned"}, found
            assert all(f"its instance {a_holder} stopped" in (r.error or "") for r in found)
            # The prune task stores the outcome (b is alive: its runs are left alone).
            scheduler = Scheduler(locks, prune=None)
            scheduler.add(lambda: None, "* * * * *", name="job")
            assert await scheduler.tasks.store_abandoned() == len(dead)
            stored = [
                r for r in await locks.store.runlog.stored_runs("job", 100) if r.run_id in dead
            ]
        assert {r.outcome for r in stored} == {"abandoned"}
        assert all(r.ended is not None and r.ended >= killed for r in stored)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
