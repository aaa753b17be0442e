"""The README's examples run as written."""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tenure import Outcome, Scheduler

README = Path(__file__).parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as answer:
        body: bytes = answer.read()
        return body


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


async def test_the_events_example_logs_counts_and_serves_metrics(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from prometheus_client import REGISTRY

    from tenure import LockService
    from tenure.stores.memory import MemoryStore

    code = _block("locks.subscribe(log_events())").replace(
        'start_http_server(9464, addr="127.0.0.1")',
        'served = start_http_server(0, addr="127.0.0.1")',  # any free port, and shut down below
    )
    namespace: dict[str, Any] = {"__name__": "readme", "locks": LockService(MemoryStore())}
    exec(compile(code, "README.md", "exec"), namespace)
    server, thread = namespace["served"]
    try:
        async with namespace["locks"] as locks:
            with caplog.at_level(logging.DEBUG, logger="tenure"):
                lock = await locks.acquire("readme-events")
                assert lock is not None
                await lock.release()
        assert (
            REGISTRY.get_sample_value(
                "tenure_acquire_attempts_total", {"lock": "readme-events", "result": "granted"}
            )
            == 1.0
        )
        logged = [record.getMessage() for record in caplog.records]
        assert any("acquired 'readme-events'" in message for message in logged), logged
        assert not any(lock.token in message for message in logged), "no secrets"
        assert "acquired readme-events" in capsys.readouterr().out
        port = server.server_address[1]
        page = await asyncio.to_thread(_fetch, f"http://127.0.0.1:{port}/metrics")
        assert b"tenure_hold_seconds" in page
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
