"""``tenure pause``, ``resume``, ``trigger`` and ``audit`` end to end: three
``tenure run`` processes on one store obey a pause made from another process,
take a run request once, and each action is audited."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenure import LockService, RunOutcome
from tenure.control import CONTROL_POLL
from tenure.stores.runlog import live_instances

from .helpers.procs import ROOT
from .test_cli import tenure


@pytest.fixture
def three(tmp_path: Path) -> Iterator[str]:
    """Three ``tenure run`` processes of ``cli_app:make`` on one SQLite file; its URL."""
    url = f"sqlite://{tmp_path}/control.db"
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tenure", "run", "tests.helpers.cli_app:make", "--url", url],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        yield url
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            assert "Traceback" not in err


async def test_three_processes_obey_a_pause_and_take_a_run_request_once(three: str) -> None:
    url = three
    async with LockService.from_url(url) as reader:
        deadline = time.monotonic() + 30
        while len(await live_instances(reader.store)) < 3 or not await reader.store.runlog.runs(
            "cli.tick"
        ):
            assert time.monotonic() < deadline, "the three instances did not start serving"
            await asyncio.sleep(0.2)
        paused = await asyncio.to_thread(
            tenure, "pause", "cli.tick", "--url", url, "--reason", "db"
        )
        assert paused.returncode == 0, paused.stderr
        assert "paused 'cli.tick'" in paused.stdout
        obeyed = time.time() + CONTROL_POLL + 1.0  # every instance has read the board since
        await asyncio.sleep(3.5)
        shown = await asyncio.to_thread(tenure, "tasks", "--url", url)
        assert re.search(r"cli\.tick .* paused since .* by .*, \d+ skipped", shown.stdout)
        resumed = await asyncio.to_thread(tenure, "resume", "cli.tick", "--url", url)
        assert resumed.returncode == 0, resumed.stderr
        said = re.search(r"; (\d+) occurrence\(s\) skipped", resumed.stdout)
        assert said is not None, resumed.stdout
        assert int(said[1]) >= 2
        assert len(await live_instances(reader.store)) == 3, "all three served throughout"
        runs = await reader.store.runlog.runs("cli.tick", 1000)
        [pause] = [r for r in runs if r.outcome == RunOutcome.PAUSED]
        assert pause.ended is not None
        during = [
            r.fire_time
            for r in runs
            if r.fire_time is not None and obeyed < r.fire_time < pause.ended - CONTROL_POLL
        ]
        assert during == [], "no instance ran an occurrence while it was paused"

        triggered = await asyncio.to_thread(tenure, "trigger", "cli.tick", "--url", url)
        assert triggered.returncode == 0, triggered.stderr
        assert re.search(r"'cli\.tick' started on \S+ as run [0-9a-f]{16}", triggered.stdout)
        await asyncio.sleep(2 * CONTROL_POLL)
        manual = [
            r for r in await reader.store.runlog.runs("cli.tick", 1000) if r.fire_time is None
        ]
        [run] = [r for r in manual if r.outcome != RunOutcome.PAUSED]
        # Skipped when it met an occurrence's run holding the task's lock (each
        # is brief, but one starts every second): taken and recorded once, either way.
        assert run.outcome in (RunOutcome.RAN, RunOutcome.SKIPPED)

    audit = await asyncio.to_thread(tenure, "audit", "--url", url)
    assert audit.returncode == 0, audit.stderr
    lines = audit.stdout.splitlines()
    assert [line.split()[2] for line in lines[1:] if not line.startswith(" ")] == [
        "trigger",
        "resume",
        "pause",
    ]
    bad = await asyncio.to_thread(tenure, "pause", "cli.tock", "--url", url)
    assert bad.returncode == 2
    assert "no scheduler serves a task named 'cli.tock'; known: cli.tick" in bad.stderr
    again = await asyncio.to_thread(tenure, "resume", "cli.tick", "--url", url)
    assert again.returncode == 2 and "is not paused: nothing changed" in again.stderr
