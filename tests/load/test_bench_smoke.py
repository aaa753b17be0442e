"""The benchmarks in a few iterations, so that they cannot rot. Nothing about time is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(script: str, *args: str, timeout: float) -> str:
    """Run ``bench/<script>``; what it printed, once it exited 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_load_benchmark_runs(tmp_path: Path) -> None:
    """On the stores whose burst has a peer beside it (Redis, PostgreSQL) and the
    embedded one: the script's code is the same for every store past the URL, and
    the other stores' servers are started the same way by the suite's fixtures."""
    chart = tmp_path / "lateness.svg"
    few = "sqlite,redis,postgres"
    printed = bench("load.py", "--smoke", "--stores", few, "--chart", str(chart), timeout=300)
    stores = ("sqlite", "redis", "postgres (fsync=off)")
    for store in stores:
        assert f"## {store}" in printed
    failures = [int(n) for n in re.findall(r"\((\d+)\)", printed)]
    assert failures and not any(failures), printed
    assert printed.count("herd: 10 waiters") == len(stores)
    assert printed.count("redis-py Lock") == printed.count("hand-written lease") == 1, printed
    # The scheduler section: APScheduler and each store, nothing missing or doubled.
    assert printed.count("missing 0, doubled 0") == len(stores) + 1, printed
    # The chart of the site's benchmarks page: one histogram per contender.
    drawn = chart.read_text()
    assert drawn.startswith("<?xml") and "<svg" in drawn
    for store in few.split(","):
        assert f"tenure, {store}, 3 instances: median" in drawn
    assert "APScheduler 3, one process: median" in drawn


def test_the_semaphore_benchmark_runs(tmp_path: Path) -> None:
    """bench/semaphores.py on SQLite (the others need only their servers, which
    the suite's fixtures start the same way)."""
    few = ["--n", "20", "--rounds", "1", "--waiters", "24", "--failovers", "1", "--ttl", "1"]
    printed = bench("semaphores.py", "--store", "sqlite", *few, timeout=120)
    assert "permit acquire+release" in printed, printed
    assert "SQLite: herd, 24 callers on a semaphore of 4" in printed, printed
    assert "SQLite: leader SIGKILLed, standby elected after" in printed, printed
