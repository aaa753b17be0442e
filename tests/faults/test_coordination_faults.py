"""Semaphores and elections under the fault suite's nemeses, judged by its checker.

The workers of tests/faults take a permit (``semaphore:2``) or a term
(``election``) instead of a lock; the checker then asks "at most two permit
intervals at once" or, for terms, the lock's "one at a time, tokens rising in
real time". The lock's own scenarios of a killed, paused or cut-off holder run
with terms too (test_faults.py, ``kind``). Each scenario runs on every store
that several processes share, with a TTL of one second, and proves that its
fault bit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenure.lease import safety_margin
from tenure.stores import from_url

from ..conftest import StoreKind
from ..servers import EtcdCluster, PostgresServer, RedisServer
from .history import most_at_once, read_logs, violations
from .test_faults import TTL, Run

LIMIT = 2
SEMAPHORE = f"semaphore:{LIMIT}"


@pytest.fixture
def run(shared_url: str, tmp_path: Path) -> Iterator[Run]:
    scenario = Run(shared_url, tmp_path)
    yield scenario
    scenario.close()


def test_semaphore_six_processes_never_more_than_the_limit(run: Run) -> None:
    run.start(6, iterations=4, hold=0.1, kind=SEMAPHORE)
    history = run.finish()
    assert len(history) == 24, f"workers' exit codes: {run.exit_codes()}"
    assert violations(history, limit=LIMIT) == []
    assert all(g.released for g in history), "every permit was still held at its release"
    most, _ = most_at_once(history)
    assert most == LIMIT, "the load filled the semaphore"
    waits = sorted(g.granted - g.requested for g in history)
    assert waits[-1] > 20_000_000, f"contended: some acquire waited for a permit ({waits} ns)"


def test_semaphore_holder_paused_past_twice_the_ttl(run: Run) -> None:
    run.start(1, iterations=1, hold=0.3, kind=SEMAPHORE)
    run.wait_until_holding("w0")
    run.start(3, iterations=3, hold=0.4, kind=SEMAPHORE)
    paused_at = time.monotonic_ns()
    os.kill(run.workers["w0"].pid, signal.SIGSTOP)
    time.sleep(2.5 * TTL)
    resumed_at = time.monotonic_ns()
    os.kill(run.workers["w0"].pid, signal.SIGCONT)
    history = run.finish()
    assert resumed_at - paused_at > 2 * TTL * 1e9, "the pause outlasted twice the TTL"
    assert violations(history, limit=LIMIT) == []
    [paused] = [g for g in history if g.worker == "w0"]
    assert paused.end < resumed_at, "the paused holder's permit ended at its deadline"
    assert paused.released is False, "its late release was a no-op"
    others = [g for g in history if g.worker != "w0"]
    both = [
        (a, b)
        for a in others
        for b in others
        if a is not b and paused.end < b.granted < resumed_at and a.granted <= b.granted < a.end
    ]
    assert both, "during the pause, others held both permits: the paused one's was freed"
    assert len(history) == 10


def test_semaphore_store_paused_for_one_and_a_half_ttls(run: Run, shared_kind: StoreKind) -> None:
    run.start(2, iterations=1, hold=2.5 * TTL, kind=SEMAPHORE)
    run.wait_until_holding("w0")
    run.wait_until_holding("w1")
    run.start(2, iterations=2, kind=SEMAPHORE)
    for worker in ("w2", "w3"):
        run.wait_for(worker, "ready")
    store = from_url(run.url)
    try:
        paused_at = time.monotonic_ns()
        with shared_kind.outage(store):
            time.sleep(1.5 * TTL)
        resumed_at = time.monotonic_ns()
    finally:
        asyncio.run(store.aclose())
    history = run.finish()
    assert resumed_at - paused_at >= 1.5 * TTL * 1e9
    assert violations(history, limit=LIMIT) == []
    held = [g for g in history if g.worker in ("w0", "w1")]
    assert all(paused_at < g.end < resumed_at for g in held), "both gave up during the pause"
    assert all(g.released is False for g in held)
    later = [g for g in history if g.worker in ("w2", "w3")]
    assert len(later) == 4 and min(g.granted for g in later) > max(g.end for g in held)


def test_semaphore_holder_wall_clock_stepped_by_an_hour(run: Run) -> None:
    """A permit's time is the store's clock or this host's monotonic one: a
    holder whose wall clock jumps an hour ahead keeps its permit to its release."""
    run.start(1, iterations=1, hold=3 * TTL, wall_step=3600.0, kind=SEMAPHORE)
    run.wait_until_holding("w0")
    run.start(2, iterations=3, kind=SEMAPHORE)
    history = run.finish()
    [mine] = read_logs([run.log("w0")]).values()
    [stepped] = [e for e in mine if e["op"] == "wallstep"]
    assert abs(stepped["after"] - stepped["before"] - 3600.0) < 1, "the wall clock jumped"
    assert violations(history, limit=LIMIT) == []
    [held] = [g for g in history if g.worker == "w0"]
    assert held.released is True and all(c["held"] for c in held.checks)
    assert held.end - stepped["t"] > 2.5 * TTL * 1e9, "renewed well past the step"
    assert len(history) == 7


@pytest.mark.parametrize("kind", [SEMAPHORE, "election"])
@pytest.mark.parametrize("store", ["postgres", "etcd"])
def test_durable_store_killed_and_restarted(store: str, kind: str, tmp_path: Path) -> None:
    """PostgreSQL and etcd (every member killed) keep permits and terms through
    a restart: the holders ride through it, and a process that asks once the
    store is back is not granted what they hold."""
    server: PostgresServer | EtcdCluster = (
        PostgresServer() if store == "postgres" else EtcdCluster()
    )
    url = server.url() if isinstance(server, PostgresServer) else server.url
    holders = LIMIT if kind == SEMAPHORE else 1
    limit = LIMIT if kind == SEMAPHORE else 1
    scenario = Run(url, tmp_path)
    try:
        scenario.start(holders, iterations=1, hold=3 * TTL, kind=kind)
        for i in range(holders):
            scenario.wait_until_holding(f"w{i}")
        time.sleep(0.2)
        killed_at = time.monotonic_ns()
        server.restart()
        restarted_at = time.monotonic_ns()
        scenario.start(1, iterations=1, kind=kind)
        history = scenario.finish()
        assert restarted_at > killed_at, "the server was killed and started again"
        assert violations(history, limit=limit) == []
        first = [g for g in history if g.worker != f"w{holders}"]
        [late] = [g for g in history if g.worker == f"w{holders}"]
        assert late.fence > max(g.fence for g in first), "tokens rise across the restart"
        tolerance = (TTL - safety_margin(TTL) - TTL / 3) * 1e9
        if restarted_at - killed_at < tolerance:
            assert all(g.released is True for g in first), "the grants survived the restart"
            assert late.granted > min(g.end for g in first)
    finally:
        scenario.close()
        server.stop()


@pytest.mark.parametrize("kind", [SEMAPHORE, "election"])
def test_redis_without_persistence_restarted_forgets_permits_and_terms(
    kind: str, tmp_path: Path
) -> None:
    """Redis without persistence forgets permits and terms in a restart, as it
    forgets leases: a process queued behind the holders is granted long before
    they would have let go, the holders hear that they lost what they held,
    and fencing tokens still rise (the server's ``TIME`` floor). Whether the
    newcomer's grant overlaps the holders' last moments is a race; when it
    does, the checker finds exactly that and nothing else. Every process
    exits cleanly: a waiter's pub/sub connection cut by the restart is
    replaced, not left broken."""
    server = RedisServer()
    holders = LIMIT if kind == SEMAPHORE else 1
    hold = 4 * TTL
    scenario = Run(server.url, tmp_path)
    try:
        scenario.start(holders, iterations=1, hold=hold, kind=kind)
        for i in range(holders):
            scenario.wait_until_holding(f"w{i}")
        scenario.start(1, iterations=1, kind=kind)
        scenario.wait_for(f"w{holders}", "ready")  # waiting behind the holders
        time.sleep(0.3)
        killed_at = time.monotonic_ns()
        server.restart()
        restarted_at = time.monotonic_ns()
        history = scenario.finish()
        assert restarted_at > killed_at, "the server was killed and started again"
        first = [g for g in history if g.worker != f"w{holders}"]
        [late] = [g for g in history if g.worker == f"w{holders}"]
        assert late.granted > killed_at, "the newcomer waited until the restart"
        assert late.granted < min(g.granted for g in first) + hold * 1e9, (
            "granted before the holders would have let go: their grants were forgotten"
        )
        assert all(g.released is False for g in first), "the holders lost what they held"
        assert late.fence > max(g.fence for g in first), "yet fencing still increases"
        expected = "permits were held at once" if kind == SEMAPHORE else "leases overlap"
        found = violations(history, limit=LIMIT if kind == SEMAPHORE else 1)
        assert all(expected in v for v in found), found
        assert set(scenario.exit_codes().values()) == {0}, scenario.exit_codes()
    finally:
        scenario.close()
        server.stop()
