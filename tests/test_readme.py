"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tenure import Outcome, Scheduler

README = Path(__file__).parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def _block(containing: str) -> str:
    [block] = [b for b in _blocks() if containing in b]
    return block


def test_the_lock_example_runs(tmp_path: Path) -> None:
    lock_example = _block("from tenure import LockService, Outcome, current_lock")
    code = lock_example.replace("/tmp/myapp-tenure.db", f"{tmp_path}/readme.db")
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)


async def test_the_scheduler_example_registers_and_runs(tmp_path: Path) -> None:
    code = _block("scheduler = Scheduler(locks)").replace(
        "/tmp/myapp-tenure.db", f"{tmp_path}/readme.db"
    )
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    scheduler: Scheduler = namespace["scheduler"]
    names = {task.name for task in scheduler.tasks}
    assert {"nightly-report", "tenure.prune"} <= names
    assert len(names) == 4
    async with namespace["locks"]:
        assert await scheduler.tasks.run("nightly-report") is Outcome.RAN


def test_the_blocking_example_runs(tmp_path: Path) -> None:
    code = _block("from tenure.sync import").replace("/tmp/myapp-tenure.db", f"{tmp_path}/b.db")
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    with namespace["LockService"].from_url(f"sqlite://{tmp_path}/b.db") as locks:
        lock = locks.acquire("reindex-catalog")
        assert lock is not None, "the example released what it held"
