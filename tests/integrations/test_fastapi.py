"""The FastAPI page's example, as written, under a real ``uvicorn --workers 3``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tenure.stores.runlog import RunOutcome

from ..helpers import reading
from ..helpers.procs import ROOT, until_it_answers
from ..servers import free_port

PAGE = ROOT / "docs/integrations/fastapi.md"


def _example() -> str:
    found: list[str] = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    [code] = found
    return code


def test_each_occurrence_runs_once_across_three_workers(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(_example())
    url = f"sqlite://{tmp_path}/app.db"
    port = free_port()
    env = dict(os.environ, TENURE_URL=url, PYTHONPATH=str(ROOT / "src"))
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--workers", "3", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page = f"http://127.0.0.1:{port}/locks"
        until_it_answers(server, lambda: urllib.request.urlopen(page, timeout=2).close(), "uvicorn")
        time.sleep(15)
        serving = reading.serving(url)
        assert len(serving) == 3, f"three workers serve the scheduler: {serving}"
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, err
    assert "ERROR" not in err and "Traceback" not in err, err
    assert len(re.findall(r"Finished server process \[\d+\]", err)) == 3, err
    records = reading.runs(url, "app.heartbeat")
    fires = sorted(r.fire_time for r in records if r.fire_time is not None)
    assert all(r.outcome == RunOutcome.RAN for r in records), records
    assert len(fires) == len(set(fires)), "no occurrence ran twice"
    assert len(fires) >= 14
    assert fires == [fires[0] + i for i in range(len(fires))], "none missing"
    printed = re.findall(r"heartbeat for (\S+) in worker \d+", out)
    assert sorted(float(f) for f in printed) == fires
