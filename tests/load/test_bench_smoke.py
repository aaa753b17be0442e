"""bench/load.py in its smoke mode, so that it cannot rot. Nothing about time is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_load_benchmark_runs_on_every_store(tmp_path: Path) -> None:
    chart = tmp_path / "lateness.svg"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load.py"), "--smoke", "--chart", str(chart)],
        check=False,
        capture_output=True,
        text=True,
        timeout=420,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    for store in ("sqlite", "redis", "postgres (fsync=off)", "etcd"):
        assert f"## {store}" in done.stdout
    failures = [int(n) for n in re.findall(r"\((\d+)\)", done.stdout)]
    assert failures and not any(failures), done.stdout
    assert done.stdout.count("herd: 10 waiters") == 4
    # The scheduler section: APScheduler and each store, nothing missing or doubled.
    assert done.stdout.count("missing 0, doubled 0") == 5, done.stdout
    # The chart of the site's benchmarks page: one histogram per contender.
    drawn = chart.read_text()
    assert drawn.startswith("<?xml") and "<svg" in drawn
    for store in ("sqlite", "redis", "postgres", "etcd"):
        assert f"tenure, {store}, 3 instances: median" in drawn
    assert "APScheduler 3, one process: median" in drawn
