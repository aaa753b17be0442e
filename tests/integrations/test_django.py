"""The Django page's example, as written: a real project made in a temporary
directory, ``manage.py tenure_run`` on three processes writing through the
ORM, an exclusive management command, and settings errors at start-up."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tenure.stores.runlog import RunOutcome

from ..helpers import reading
from ..helpers.procs import ROOT

PAGE = ROOT / "docs/integrations/django.md"
MANAGE = """\
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "myproject.settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""


def _project(root: Path) -> None:
    """The page's files, and the packages and manage.py around them."""
    text = PAGE.read_text()
    files = re.findall(r"<!-- run-by: \S+ \(file (\S+)\) -->\n```python\n(.*?)```", text, re.S)
    assert len(files) == 4, files
    for name, code in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    for package in ("myproject", "counter", "counter/management", "counter/management/commands"):
        (root / package / "__init__.py").touch()
    (root / "manage.py").write_text(MANAGE)


def _manage(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_tenure_run_on_three_processes_runs_each_occurrence_once(tmp_path: Path) -> None:
    _project(tmp_path)
    url = f"sqlite://{tmp_path}/tenure.db"
    env = dict(os.environ, TENURE_URL=url, PYTHONPATH=str(ROOT / "src"))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    for step in (("makemigrations", "counter"), ("migrate", "--no-input")):
        done = _manage(tmp_path, env, *step)
        assert done.returncode == 0, done.stdout + done.stderr
    runners = [
        subprocess.Popen(
            [sys.executable, "manage.py", "tenure_run"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        time.sleep(7)
        serving = reading.serving(url)
        registered = reading.registered(url)
        for runner in runners:
            runner.send_signal(signal.SIGTERM)
        outputs = [runner.communicate(timeout=60) for runner in runners]
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
                runner.communicate()
    for runner, (out, err) in zip(runners, outputs, strict=True):
        assert runner.returncode == 0, err
        assert "Traceback" not in err, err
        assert "serving 3 task(s)" in err, "both of the app's tasks and tenure.prune"
        assert "tenure_run stopped: 2 task(s)" in out
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        fires = sorted(row[0] for row in db.execute("SELECT fire_time FROM counter_tick"))
    assert len(fires) >= 4
    assert fires == [fires[0] + i for i in range(len(fires))], "each second once, none missing"
    records = reading.runs(url, "counter.tick")
    assert sorted(r.fire_time for r in records if r.fire_time is not None) == fires
    assert all(r.outcome == RunOutcome.RAN for r in records), "no write was refused as a double"
    # Each occurrence goes to the task's preferred instance while all are up:
    # that the three served is what their presence leases say.
    assert len(serving) == 3, serving
    assert registered == {
        "counter.tick": "every 1s",
        "counter.prune": "0 3 * * *",
        "tenure.prune": "*/10 * * * *",
    }, registered


def test_an_exclusive_command_runs_once_at_a_time(tmp_path: Path) -> None:
    _project(tmp_path)
    env = dict(os.environ, TENURE_URL=f"sqlite://{tmp_path}/tenure.db")
    env["PYTHONPATH"] = str(ROOT / "src")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    both = [
        subprocess.Popen(
            [sys.executable, "manage.py", "rebuild_index"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=60) for proc in both]
    assert [proc.returncode for proc in both] == [0, 0], outputs
    said = sorted(out.strip() or err.strip() for out, err in outputs)
    assert said == ["index rebuilt", "skipped: another process holds 'counter.rebuild-index'"]


def test_bad_settings_stop_django_at_start_up(tmp_path: Path) -> None:
    _project(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    bad = {
        "no_url": ("del TENURE_URL", "TENURE_URL must be a store URL"),
        "number": ("TENURE_URL = 42", "TENURE_URL must be a store URL (such as"),
        "scheme": ('TENURE_URL = "mongodb://h/db"', "unknown store URL scheme 'mongodb'"),
        "options": ("TENURE_SCHEDULER = {'misfire_grace': -1}", "misfire_grace must be finite"),
        "not_a_dict": ("TENURE_SCHEDULER = ['x']", "TENURE_SCHEDULER must be a dict"),
    }
    for name, (line, says) in bad.items():
        (tmp_path / "myproject" / f"{name}.py").write_text(f"from .settings import *\n{line}\n")
        done = _manage(tmp_path, env, "check", "--settings", f"myproject.{name}")
        assert done.returncode == 1, (name, done.stdout, done.stderr)
        assert "ImproperlyConfigured" in done.stderr and says in done.stderr, (name, done.stderr)
