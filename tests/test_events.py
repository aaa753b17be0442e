"""Event hooks, structured log events and the Prometheus exporter."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tenure import Event, EventKind, InvalidArgument, LockService, Scheduler, log_events
from tenure.lease import LOST_BY_DEADLINE
from tenure.prometheus import PrometheusMetrics

from .conftest import STORES

TTL = 1.0


def sqlite_url(tmp: Path) -> str:
    return STORES["sqlite"].make_url(tmp)


async def test_each_acquire_release_and_contention_is_an_event(tmp_path: Path) -> None:
    seen: list[Event] = []
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        unsubscribe = locks.subscribe(seen.append)
        lock = await locks.acquire("e", ttl=TTL)
        assert lock is not None
        assert await locks.acquire("e", ttl=TTL, wait=0.2) is None
        await asyncio.sleep(0.05)
        assert await lock.release()
        unsubscribe()
        again = await locks.acquire("e", ttl=TTL)
        assert again is not None
        await again.release()
    assert [e.kind for e in seen] == ["acquired", "contended", "released"]
    assert [e.kind for e in seen] == [EventKind.ACQUIRED, EventKind.CONTENDED, EventKind.RELEASED]
    assert all(type(e.kind) is EventKind for e in seen), "a closed vocabulary, not loose strings"
    acquired, contended, released = seen
    assert acquired.name == "e" and acquired.holder == locks.holder
    assert acquired.fencing_token == lock.fencing_token
    assert contended.seconds is not None and contended.seconds >= 0.2, "the wait is counted"
    assert released.detail == "held"
    assert released.seconds is not None and released.seconds >= 0.05
    assert all(lock.token not in repr(e) for e in seen), "never the secret token"


async def test_a_loss_and_failed_renewals_are_events(tmp_path: Path) -> None:
    seen: list[Event] = []
    threads: list[str] = []
    kind = STORES["sqlite"]
    async with LockService.from_url(kind.make_url(tmp_path)) as locks:
        locks.subscribe(seen.append)
        locks.subscribe(lambda _: threads.append(threading.current_thread().name))
        lock = await locks.acquire("lose", ttl=TTL)
        assert lock is not None
        with kind.outage(locks.store):
            await asyncio.sleep(1.5 * TTL)
        assert lock.lost
        assert await lock.release() is False
    kinds = [e.kind for e in seen]
    assert "renewal_failed" in kinds
    [lost] = [e for e in seen if e.kind == "lost"]
    assert lost.detail == LOST_BY_DEADLINE and lost.fencing_token == lock.fencing_token
    assert threads[seen.index(lost)] == "tenure-renewer", "reported by the renewer"
    failed = next(e for e in seen if e.kind == "renewal_failed")
    assert failed.count == 1 and failed.detail
    assert seen[-1].kind == "released" and seen[-1].detail == "lost"


async def test_reading_held_past_the_deadline_only_computes_it(tmp_path: Path) -> None:
    """``held``, ``lost`` and ``lost_reason`` compute the answer and change
    nothing: the loss event comes from the renewer's thread, not from whichever
    thread happened to read."""
    seen: list[tuple[Event, str]] = []
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(lambda event: seen.append((event, threading.current_thread().name)))
        lock = await locks.acquire("read", ttl=0.5)
        assert lock is not None and lock.held
        locks.renewer.stop()  # nobody renews it now, and nobody reports its loss
        await asyncio.sleep(max(lock.held_until - time.monotonic(), 0) + 0.05)
        for _ in range(3):
            assert not lock.held
            assert lock.lost and lock.lost_reason == LOST_BY_DEADLINE
        assert [e.kind for e, _ in seen] == ["acquired"], "reading reported nothing"
        assert await lock.release() is False
    assert [(e.kind, e.detail) for e, _ in seen] == [("acquired", None), ("released", "lost")]


async def test_a_release_while_another_thread_says_the_loss_comes_second(
    tmp_path: Path,
) -> None:
    """The renewer's thread finds the loss and says it (its log line, then the
    hooks); a release woken by the loss meanwhile waits for that, so that its
    event follows the loss's (a tracer ends the hold span with the reason)."""
    seen: list[tuple[EventKind, str | None]] = []
    saying = threading.Event()

    def slow_on_loss(event: Event) -> None:
        if event.kind == EventKind.LOST:
            saying.set()
            time.sleep(0.3)  # a slow hook: the release arrives in the middle
        seen.append((event.kind, event.detail))

    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(slow_on_loss)
        lock = await locks.acquire("said", ttl=TTL)
        assert lock is not None
        assert await locks.force_release("said") is not None
        await asyncio.wait_for(lock.wait_lost(), 5)
        assert await asyncio.to_thread(saying.wait, 5), "the renewer's thread is saying it"
        assert await lock.release() is False
        kinds = [kind for kind, _ in seen]
        assert kinds.index(EventKind.LOST) < kinds.index(EventKind.RELEASED), seen


async def test_a_failing_hook_is_logged_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: Event) -> None:
        raise RuntimeError("hook bug")

    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(broken)
        with caplog.at_level(logging.ERROR, logger="tenure.events"):
            lock = await locks.acquire("h", ttl=TTL)
            assert lock is not None and lock.held
            assert await lock.release()
    assert "hook failed" in caplog.text
    with pytest.raises(InvalidArgument, match="must be callable"):
        locks.subscribe("not a function")  # type: ignore[arg-type]


async def test_task_runs_are_events(tmp_path: Path) -> None:
    seen: list[Event] = []
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(seen.append)
        scheduler = Scheduler(locks)

        async def job() -> None:
            await asyncio.sleep(0.02)

        scheduler.add(job, "* * * * *", name="job")
        await scheduler.tasks.run("job", occurrence=60.0)
        await scheduler.tasks.run("job", occurrence=60.0)  # already claimed
    tasks = [e for e in seen if e.kind == "task"]
    assert [t.detail for t in tasks] == ["ran", "claimed_elsewhere"]
    assert tasks[0].seconds is not None and tasks[0].seconds >= 0.02


async def test_log_events_writes_structured_records_without_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(log_events())
        with caplog.at_level(logging.DEBUG, logger="tenure.events"):
            lock = await locks.acquire("logged", ttl=TTL)
            assert lock is not None
            await lock.release()
    [acquired] = [r for r in caplog.records if getattr(r, "tenure_event", None) == "acquired"]
    assert acquired.levelno == logging.DEBUG
    assert acquired.lock == "logged"  # type: ignore[attr-defined]
    assert acquired.holder == locks.holder  # type: ignore[attr-defined]
    assert acquired.fencing_token == lock.fencing_token  # type: ignore[attr-defined]
    assert f"fencing_token={lock.fencing_token}" in acquired.getMessage()
    assert lock.token not in caplog.text


async def test_prometheus_metrics(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    async with LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(metrics)
        lock = await locks.acquire("p", ttl=TTL)
        assert lock is not None
        assert await locks.acquire("p", ttl=TTL) is None
        await lock.release()
        held = await locks.acquire("forced", ttl=TTL)
        assert held is not None
        assert await locks.force_release("forced") is not None
        scheduler = Scheduler(locks)
        scheduler.add(lambda: None, "* * * * *", name="t")
        await scheduler.tasks.run("t", occurrence=60.0)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("tenure_acquire_attempts_total", lock="p", result="granted") == 1
    assert value("tenure_acquire_attempts_total", lock="p", result="contended") == 1
    assert value("tenure_acquire_wait_seconds_count", lock="p") == 2
    assert value("tenure_hold_seconds_count", lock="p") == 1
    assert value("tenure_task_runs_total", task="t", outcome="ran") == 1
    assert value("tenure_task_duration_seconds_count", task="t") == 1
    # The task's own lock is counted too.
    assert value("tenure_acquire_attempts_total", lock="t", result="granted") == 1
    assert value("tenure_renewal_failures_total") == 0
    assert value("tenure_forced_releases_total", lock="forced") == 1


def test_prometheus_without_lock_labels_and_the_blocking_api(tmp_path: Path) -> None:
    from tenure import sync

    registry = CollectorRegistry()
    with sync.LockService.from_url(sqlite_url(tmp_path)) as locks:
        locks.subscribe(PrometheusMetrics(registry, lock_labels=False))
        for i in range(3):
            lock = locks.acquire(f"user-{i}", ttl=TTL)
            assert lock is not None
            lock.release()
    assert (
        registry.get_sample_value(
            "tenure_acquire_attempts_total", {"lock": "", "result": "granted"}
        )
        == 3
    )
