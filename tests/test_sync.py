"""What only the blocking API has to show: threads, blocking work, fork, the decorator."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tenure
from tenure import ConfigurationError, sync
from tenure.lease import LOST_BY_FORK, LOST_BY_STORE
from tenure.sync import LockLost, LockService, Outcome, current_lock

from .helpers.procs import HELPERS, ROOT

TTL = 1.0


def _delete_lease(service: LockService, name: str, token: str) -> bool:
    """Take the lease away in the store, as an expiry or another writer would."""

    async def delete() -> bool:
        store = service.store.sibling()
        try:
            return await store.release(name, token)
        finally:
            if store is not service.store:
                await store.aclose()

    return asyncio.run(delete())


@pytest.fixture
def blocking(url: str) -> Iterator[LockService]:
    with LockService.from_url(url) as service:
        yield service


def test_threads_contending_never_overlap(blocking: LockService) -> None:
    inside = 0
    most = 0
    grants: list[int] = []
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, most
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            lock = blocking.acquire("shared", ttl=TTL, wait=1.0)
            if lock is None:
                continue
            with guard:
                inside += 1
                most = max(most, inside)
                grants.append(lock.fencing_token)
            time.sleep(0.002)
            with guard:
                inside -= 1
            assert lock.release()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1
    assert len(grants) >= 8, "the threads really took turns"
    assert len(set(grants)) == len(grants)


def test_processes_contending_through_the_blocking_api_lose_no_update(
    shared_url: str, tmp_path: Path
) -> None:
    """Four processes, each a tenure.sync service, take turns at a
    read-modify-write of one file: every store's plain-call acquire and
    release, across processes."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{ROOT}")
    workers = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "sync_counter.py"), shared_url, str(counter), "1.5"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    outputs = [worker.communicate(timeout=90)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0, 0], outputs
    turns = sorted(tuple(turn) for out in outputs for turn in json.loads(out)["turns"])
    assert len(turns) >= 8, "the processes really took turns"
    assert int(counter.read_text()) == len(turns), "no update was lost: one holder at a time"
    fences = [fence for _, fence in turns]
    assert fences == sorted(fences) and len(set(fences)) == len(fences)


def test_a_lock_acquired_in_one_thread_is_released_from_another(blocking: LockService) -> None:
    lock = blocking.acquire("handed-over", ttl=TTL)
    assert lock is not None
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(lock.release()))
    thread.start()
    thread.join()
    assert result == [True]
    assert not lock.held
    assert blocking.acquire("handed-over", ttl=TTL) is not None


def test_cpu_bound_work_keeps_its_lock(blocking: LockService) -> None:
    seen: dict[str, Any] = {}

    def crunch() -> None:
        # Three TTLs of pure Python on this thread: only the renewer's own
        # thread can keep the lease alive meanwhile.
        deadline = time.monotonic() + 3 * TTL
        n = 0
        while time.monotonic() < deadline:
            n += 1
        seen["held"] = current_lock().held
        seen["async-view"] = tenure.current_lock().held
        seen["renewals"] = blocking._core.renewer.round_trips

    before = blocking._core.renewer.round_trips
    assert blocking.run_exclusively("crunch", crunch, ttl=TTL) is Outcome.RAN
    assert seen["held"] is True
    assert seen["async-view"] is True
    assert seen["renewals"] - before >= 6


def test_loss_under_blocking_work_raises_when_it_returns(blocking: LockService) -> None:
    observed: list[bool] = []

    def work() -> None:
        lock = current_lock()
        # The lease vanishes from the store (an operator, an expiry elsewhere).
        assert _delete_lease(blocking, lock.name, lock.token)
        # Seen at the next renewal (every TTL/3); the bound is generous for a loaded host.
        deadline = time.monotonic() + 15 * TTL
        while lock.held and time.monotonic() < deadline:
            time.sleep(0.02)
        # Another thread sees it too.
        checker = threading.Thread(target=lambda: observed.append(lock.lost))
        checker.start()
        checker.join()

    with pytest.raises(LockLost) as caught:
        blocking.run_exclusively("vanishing", work, ttl=TTL)
    assert caught.value.reason == LOST_BY_STORE
    assert observed == [True]


def test_errors_propagate_after_the_release(blocking: LockService) -> None:
    def boom() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        blocking.run_exclusively("boom", boom, ttl=TTL)
    assert blocking.acquire("boom", ttl=TTL) is not None


def test_async_functions_are_refused(blocking: LockService) -> None:
    async def work() -> None: ...

    with pytest.raises(tenure.InvalidArgument, match="async function"):
        blocking.run_exclusively("async", work)


def test_the_decorator_returns_the_outcome_and_skips_on_contention(blocking: LockService) -> None:
    calls: list[int] = []

    @blocking.exclusive("nightly", ttl=TTL)
    def nightly(x: int) -> int:
        calls.append(x)
        assert nested() is Outcome.SKIPPED
        return x * 2

    @blocking.exclusive("nightly", ttl=TTL)
    def nested() -> None:
        calls.append(-1)

    assert nightly(3) is Outcome.RAN
    assert calls == [3]
    assert nightly.__name__ == "nightly"

    @blocking.exclusive()
    def default_name() -> None:
        calls.append(current_lock().name == f"{__name__}.{default_name.__qualname__}")

    assert default_name() is Outcome.RAN
    assert calls[-1] is True
    with pytest.raises(tenure.InvalidArgument):
        blocking.exclusive("bad\x00name")(lambda: None)


def test_closing_releases_everything(url: str) -> None:
    service = LockService.from_url(url)
    locks = [service.acquire(f"close-{i}", ttl=TTL) for i in range(3)]
    assert all(lock is not None for lock in locks)
    service.close()
    with LockService.from_url(url) as other:
        for i in range(3):
            assert other.acquire(f"close-{i}", ttl=TTL) is not None


def test_fork_child_neither_holds_renews_nor_releases_the_parents_locks(
    shared_url: str,
) -> None:
    with LockService.from_url(shared_url) as parent:
        lock = parent.acquire("forked", ttl=TTL)
        assert lock is not None
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running any cleanup
            # Objects that earlier tests left for the collector (the gRPC channels
            # of closed etcd services among them) must not be finalized here:
            # gRPC's core is not fork-safe, and the suite's process has used it.
            gc.disable()
            try:
                report: dict[str, Any] = {
                    "held": lock.held,
                    "lost": lock.lost,
                    "reason": lock.lost_reason,
                    "release": lock.release(),
                }
                # The same service, used in the child: reconnects by itself,
                # except on etcd, whose driver (gRPC) cannot cross a fork.
                try:
                    report["contended"] = parent.acquire("forked", ttl=TTL) is None
                    own = parent.acquire("child-own", ttl=TTL)
                    time.sleep(1.5 * TTL)  # renewed by the child's own renewer
                    report["own_held"] = own is not None and own.held
                    report["own_release"] = own is not None and own.release()
                except ConfigurationError as exc:
                    report["refused"] = "after the fork" in str(exc)
                os.write(write, json.dumps(report).encode())
            except BaseException as exc:
                os.write(write, json.dumps({"child failed": repr(exc)}).encode())
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            report = json.loads(pipe.read() or "{}")
        assert status == 0
        in_child = {"contended": True, "own_held": True, "own_release": True}
        if shared_url.startswith("etcd:"):
            in_child = {"refused": True}  # a clear error, not a crashed child
        assert report == {
            "held": False,
            "lost": True,
            "reason": LOST_BY_FORK,
            "release": False,
            **in_child,
        }
        # The parent kept its lock through all of it (longer than its TTL).
        assert lock.held
        assert lock.release() is True


def test_the_module_names_match_the_asyncio_api() -> None:
    for name in ("LockService", "Lock", "Outcome", "LockLost", "current_lock"):
        assert name in sync.__all__
    assert sync.Outcome is tenure.Outcome
    assert sync.LockLost is tenure.LockLost


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"wait": False}, "number"),
        ({"wait": -1}, "negative"),
        ({"wait": math.nan}, "nan"),
        ({"ttl": 0}, "positive"),
        ({"ttl": True}, "number"),
    ],
)
def test_bad_input_is_refused_before_the_store_is_asked(
    blocking: LockService, kwargs: dict[str, Any], says: str
) -> None:
    """Also on the plain-call path that SQLite and memory take (no coroutine)."""
    with pytest.raises(tenure.InvalidArgument, match=says):
        blocking.acquire("checked", **kwargs)
    assert blocking.acquire("checked") is not None, "and nothing was taken"


def test_with_lock_logs_a_failed_release_instead_of_raising(
    blocking: LockService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = blocking.store

    def unreachable(*args: object) -> bool:
        raise tenure.StoreUnavailable("the test's store is unreachable")

    calls = store.blocking()
    if calls is not None:
        monkeypatch.setattr(calls, "release", unreachable)
    monkeypatch.setattr(store, "release", lambda *args: _raise_unavailable(), raising=False)
    lock = blocking.acquire("quiet")
    assert lock is not None
    with caplog.at_level(logging.WARNING, logger="tenure"), lock:
        pass
    assert any("lapses by itself" in r.getMessage() for r in caplog.records), caplog.records
    assert not lock.held


async def _raise_unavailable() -> bool:
    raise tenure.StoreUnavailable("the test's store is unreachable")
