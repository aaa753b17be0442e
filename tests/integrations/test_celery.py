"""The Celery page's example, as written, under a real worker (prefork pool of
4) on a throwaway Redis broker: 50 identical tasks never run two at a time,
and a worker process killed mid-task frees its key within the TTL."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tenure import Control, RunOutcome, RunRecord
from tenure import LockService as AsyncService
from tenure.control import CONTROL_POLL
from tenure.sync import LockService

from ..helpers.procs import ROOT
from ..servers import RedisServer

PAGE = ROOT / "docs/integrations/celery.md"
WORKER = (
    *("--pool", "prefork", "--concurrency", "4"),
    *("--without-gossip", "--without-mingle", "--without-heartbeat"),
)
BEAT = ("beat", "-S", "tenure.celery.BeatScheduler", "--max-interval", "1")


def _example() -> str:
    found: list[str] = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    [code] = found
    return code


class Celery:
    """``celery -A tasks <command>`` in ``root``, its log read as it comes."""

    def __init__(self, root: Path, env: dict[str, str], *command: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks", *command, "--loglevel", "INFO"],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    return found
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the worker's log:\n{''.join(self.lines)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[ModuleType, Celery, str, dict[str, str]]]:
    """The example as tasks.py, a worker serving it, the store URL and the environment."""
    (tmp_path / "tasks.py").write_text(_example())
    broker = RedisServer()
    url = f"sqlite://{tmp_path}/tenure.db"
    env = dict(os.environ, CELERY_BROKER_URL=broker.url, TENURE_URL=url)
    env["PYTHONPATH"] = str(ROOT / "src")
    spec = importlib.util.spec_from_file_location("tasks", tmp_path / "tasks.py")
    assert spec is not None and spec.loader is not None
    os.environ["CELERY_BROKER_URL"], os.environ["TENURE_URL"] = broker.url, url
    try:
        tasks = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(tasks)
    finally:
        del os.environ["CELERY_BROKER_URL"], os.environ["TENURE_URL"]
    worker = Celery(tmp_path, env, "worker", *WORKER)
    try:
        worker.wait_for(r"celery@\S+ ready")
        yield tasks, worker, url, env
    finally:
        worker.stop()
        tasks.app.close()
        broker.stop()


def _runs(lines: list[str], report: int) -> list[tuple[float, float]]:
    """(start, end) of each run of ``report`` the worker logged."""
    started = [float(t) for t in re.findall(rf"report {report} started at (\S+)", "".join(lines))]
    ended = [float(t) for t in re.findall(rf"report {report} ended at (\S+)", "".join(lines))]
    assert len(started) == len(ended), lines
    return sorted(zip(started, ended, strict=True))


Project = tuple[ModuleType, Celery, str, dict[str, str]]


def test_identical_tasks_never_run_together(project: Project) -> None:
    tasks, worker, _, _ = project
    sent = [tasks.generate_report.delay(42) for _ in range(50)]
    results = [result.get(timeout=60) for result in sent]
    ran = [r for r in results if r is not None]
    assert ran and set(ran) == {"report 42 generated"}
    assert len(ran) < 50, "contention happened: some calls found the key taken"
    runs = _runs(worker.lines, 42)
    assert len(runs) == len(ran)
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert end <= start, f"two runs of report 42 overlapped: {runs}"
    # Another key is not held back by this one.
    assert tasks.generate_report.delay(43).get(timeout=30) == "report 43 generated"


def test_a_killed_worker_frees_its_key_within_the_ttl(project: Project) -> None:
    tasks, worker, url, _ = project
    tasks.generate_report.delay(7, seconds=60)
    pid = int(worker.wait_for(r"report 7 started at \S+ in (\d+)")[1])
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    key = tasks.generate_report.singleton_name((7,), {})
    with LockService.from_url(url) as locks:
        while (lock := locks.acquire(key, ttl=5)) is None:
            assert time.monotonic() - killed < 2 + 1, "not free within TTL + 1 s"
            time.sleep(0.05)
        freed = time.monotonic() - killed
        lock.release()
    assert 0.5 < freed < 3, freed  # held until the lease ran out, then free


def test_a_second_beat_takes_over_and_no_occurrence_is_sent_twice(
    project: Project, tmp_path: Path
) -> None:
    _, worker, _, env = project
    started = time.time()
    first = Celery(tmp_path, env, *BEAT)
    second: Celery | None = None
    try:
        first.wait_for(r"tenure: this beat sends now")
        second = Celery(tmp_path, env, *BEAT)
        second.wait_for(r"beat: Starting")
        time.sleep(4)
        assert not [line for line in second.lines if "tenure: sent" in line], "only one sends"
        first.proc.kill()  # SIGKILL: no release, no goodbye
        killed = time.monotonic()
        second.wait_for(r"tenure: this beat sends now", timeout=10)
        took_over = time.monotonic() - killed
        time.sleep(3)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert took_over < 2 + 1 + 0.5, f"took over after {took_over:.1f} s (TTL 2 s + 1 s)"
    assert second is not None
    assert [line for line in first.lines if "tenure: sent" in line], "the first one sent"
    assert [line for line in second.lines if "tenure: sent" in line], "then the second one"
    fires = sorted(float(f) for f in re.findall(r"heartbeat for (\d+\.\d+)", "".join(worker.lines)))
    assert len(fires) >= 6
    assert len(fires) == len(set(fires)), f"an occurrence ran twice: {fires}"
    expected = [fires[0] + i for i in range(int(fires[-1] - fires[0]) + 1)]
    missing = sorted(set(expected) - set(fires))
    assert len(missing) <= 1, f"more than the one in flight at the kill is missing: {missing}"
    assert fires[0] >= started - 1, "no backfill: the first sender starts at its start"
    print(f"took over in {took_over:.2f} s; ran {len(fires)}, missing {missing}")


def test_a_paused_entry_is_not_sent_and_one_asked_for_is_sent_now(
    project: Project, tmp_path: Path
) -> None:
    """The beat registers its entries for tenure.control, obeys a pause (each
    occurrence counted, none sent) and sends an entry an operator asks for."""
    _, worker, url, env = project
    beat = Celery(tmp_path, env, *BEAT)

    async def act() -> tuple[float, float, RunRecord, RunRecord]:
        async with AsyncService.from_url(url) as locks:
            control = Control(locks, by="ops@test")
            assert [r.task for r in await control.tasks()] == ["celery.beat:heartbeat"]
            await control.pause("celery.beat:heartbeat")
            obeyed = time.time() + CONTROL_POLL + 1.0  # the sender has read the board since
            await asyncio.sleep(4)
            resumed = await control.resume("celery.beat:heartbeat")
            sent = await control.trigger("celery.beat:heartbeat")
            return obeyed, time.time(), resumed, sent

    try:
        beat.wait_for(r"tenure: this beat sends now")
        obeyed, after, resumed, sent = asyncio.run(act())
        worker.wait_for(r"heartbeat for None")
        beat.wait_for(r"tenure: sent heartbeat for \d+\.\d+", timeout=5)
    finally:
        beat.stop()
    assert resumed.ended is not None
    fires = [float(f) for f in re.findall(r"heartbeat for (\d+\.\d+)", "".join(worker.lines))]
    assert not [f for f in fires if obeyed < f < resumed.ended - CONTROL_POLL], "none sent paused"
    skipped = re.findall(r"tenure: skipped heartbeat for (\S+): paused", "".join(beat.lines))
    assert len(skipped) >= 2 and resumed.error is not None
    assert resumed.error.endswith(f"; {len(skipped)} occurrence(s) skipped")
    assert (sent.outcome, sent.fire_time) == (RunOutcome.SENT, None)
    assert "tenure: sent heartbeat now, as ops@test asked" in "".join(beat.lines)
    assert sent.started <= after


BAD_KEY = """
from celery import Celery
from tenure.celery import SingletonTask

app = Celery("bad", broker="memory://")


@app.task(base=SingletonTask, singleton_key=("report",))
def generate(report_id: int) -> None: ...


app.finalize(auto=True)
"""


def test_a_key_naming_an_argument_the_task_does_not_take_fails_at_binding() -> None:
    # In a process of its own: Celery shares tasks between the apps of a process.
    done = subprocess.run(
        [sys.executable, "-c", BAD_KEY],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tenure.errors.ConfigurationError: task ")
    assert "singleton_key names ['report'], which it does not take" in last
    assert "(its arguments: ['report_id'])" in last


CONTENTION = """
import sys
from celery import Celery
from tenure.celery import SingletonTask
from tenure import Control, RunOutcome, RunRecord
from tenure import LockService as AsyncService
from tenure.control import CONTROL_POLL
from tenure.sync import LockService

app = Celery("contention", broker="memory://")
app.conf.tenure_url = sys.argv[1]
ran = []


@app.task(base=SingletonTask, singleton_key=("n",), singleton_ttl=5)
def skipping(n: int) -> str:
    ran.append(n)
    return "ran"


@app.task(base=SingletonTask, singleton_key=("n",), singleton_on_contention="retry",
          singleton_retry_countdown=3, max_retries=2)
def retrying(n: int) -> str:
    ran.append(n)
    return "ran"


with LockService.from_url(sys.argv[1]) as other:
    held = [other.acquire(task.singleton_name((1,), {})) for task in (skipping, retrying)]
    assert all(held), held
    skipped = skipping.apply(args=(1,))
    retried = retrying.apply(args=(1,))
    free = skipping.apply(args=(2,))
print(skipped.state, skipped.result, type(retried.result).__name__, free.result, ran)
"""


def test_contention_skips_or_retries_as_the_task_says(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CONTENTION, f"sqlite://{tmp_path}/contention.db"],
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # Skipped: done, without running. Retried: (eagerly, so at once) until
    # max_retries, never running while the key was held. Another key: ran.
    expected = ["SUCCESS", "None", "MaxRetriesExceededError", "ran", "[2]"]
    assert done.stdout.split() == expected, done.stdout
