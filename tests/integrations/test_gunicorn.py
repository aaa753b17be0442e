"""The Flask page's example, as written, under a real ``gunicorn --preload -w 3
--threads 4``: the blocking scheduler started at import runs in the master,
each occurrence once, and SIGTERM closes the last run and leaves nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tenure.stores.runlog import RunOutcome

from ..helpers import reading
from ..helpers.procs import ROOT, processes_naming, until_it_answers
from ..servers import free_port

PAGE = ROOT / "docs/integrations/flask.md"


def _example() -> str:
    found: list[str] = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    [code] = found
    return code


def _post(url: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_scheduler_runs_in_the_master_once_and_stops_with_it(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(_example())
    url = f"sqlite://{tmp_path}/app.db"
    port = free_port()
    bind = f"127.0.0.1:{port}"
    env = dict(os.environ, TENURE_URL=url, PYTHONPATH=str(ROOT / "src"))
    gunicorn = [sys.executable, "-m", "gunicorn", "--preload", "-w", "3", "--threads", "4"]
    master = subprocess.Popen(
        [*gunicorn, "-b", bind, "app:app"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status, body = until_it_answers(
            master, lambda: _post(f"http://{bind}/reports/1"), "gunicorn"
        )
        deadline = time.monotonic() + 30
        assert status == 200 and body["status"] == "generated", body
        while len(processes_naming(bind)) < 4:  # the other workers may still be forking
            assert time.monotonic() < deadline, f"not 1 + 3 processes: {processes_naming(bind)}"
            time.sleep(0.1)
        time.sleep(6.5)
        serving = reading.serving(url)
        assert [h.split(":")[1] for h in serving] == [str(master.pid)], (
            f"the scheduler runs in the master only: {serving}"
        )
        # SIGTERM while a run is in progress (it takes 0.3 s): its lock is held.
        # Looked for, not timed, so that a loaded host cannot make the run late.
        while not reading.held(url):
            assert time.monotonic() < deadline + 30, "no run in progress within 30 s"
            time.sleep(0.01)
        terminated = time.time()
        master.send_signal(signal.SIGTERM)
        out, err = master.communicate(timeout=60)
    finally:
        if master.poll() is None:
            master.kill()
            master.communicate()
    assert master.returncode == 0, err
    assert "Traceback" not in err and "[ERROR]" not in err, err
    assert processes_naming(bind) == [], "nothing left running"
    records = reading.runs(url, "app.heartbeat")
    assert reading.held(url) == [], "the task's lock released"
    assert all(r.ended is not None for r in records), "the last run's record is closed"
    # The run in progress at SIGTERM (the master may start more while gunicorn
    # waits out a slow worker's graceful shutdown: the scheduler stops when
    # the master does).
    last = max((r for r in records if r.started < terminated), key=lambda r: r.started)
    assert terminated < (last.ended or 0), "it was running at SIGTERM, and its record is closed"
    ran = sorted(r.fire_time for r in records if r.fire_time is not None)
    assert all(r.outcome == RunOutcome.RAN for r in records), records
    assert len(ran) >= 6 and len(ran) == len(set(ran)), "each occurrence once"
    assert ran == [ran[0] + i for i in range(len(ran))], "none missing"
    printed = re.findall(r"heartbeat for (\S+) in process (\d+)", out)
    assert {pid for _, pid in printed} == {str(master.pid)}
    assert sorted(float(fire) for fire, _ in printed) == ran
