"""What only the etcd store has to show: URLs, auth, TLS, shared leases, the leader's faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenure import ConfigurationError, LockService, StoreUnavailable
from tenure.stores import from_url
from tenure.stores.etcd import EtcdStore

from ..conftest import etcd_cluster
from ..faults.history import grants, read_logs, violations
from ..helpers.procs import ROOT
from ..helpers.until import until
from ..servers import EtcdCluster, self_signed_cert

TTL = 1.0


@pytest.fixture
def cluster() -> Iterator[EtcdCluster]:
    """A cluster of the test's own, whose members it may kill and pause."""
    own = EtcdCluster()
    yield own
    own.stop()


def test_url_forms_and_errors(tmp_path: Path) -> None:
    store = from_url(
        "etcd://u:s3cret@10.0.0.1:2379,[::1]:2380,etcd.local:2379?prefix=app&timeout=0.5"
    )
    assert isinstance(store, EtcdStore)
    assert store.endpoints == [("10.0.0.1", 2379), ("::1", 2380), ("etcd.local", 2379)]
    assert (store.prefix, store.timeout, store.username) == ("app", 0.5, "u")
    assert "s3cret" not in store.describe() and "u:***@" in store.describe()
    for bad, says in [
        ("etcd://u:s3cret@host", "not host:port"),
        ("etcd://h:1?colour=red", "unknown etcd URL option 'colour'"),
        ("etcd://h:1?timeout=soon", "timeout must be a number"),
        ("etcd://h:1?timeout=0", "timeout must be between"),
        ("etcd://h:1?in_flight_max=0", "in_flight_max must be a whole number from 1"),
        ("etcd://h:1?in_flight_max=many", "in_flight_max must be a whole number"),
        ("etcd://h:1?tls=maybe", "tls must be true or false"),
        (f"etcd://h:1?ca={tmp_path}/missing.pem", "cannot read the etcd ca file"),
        ("etcd://u@h:1", "both a user name and a password"),
        (f"etcd://h:1?cert={tmp_path}", "cannot read the etcd cert file"),
    ]:
        with pytest.raises(ConfigurationError, match=says) as caught:
            from_url(bad)
        assert "s3cret" not in str(caught.value)


async def test_locks_with_the_same_ttl_share_one_etcd_lease() -> None:
    url = f"{etcd_cluster().url}?prefix=share{os.getpid()}"
    async with LockService.from_url(url) as locks:
        maybe = [await locks.acquire(f"s{i}", ttl=2) for i in range(20)]
        held = [lock for lock in maybe if lock is not None]
        other = await locks.acquire("other-ttl", ttl=3)
        assert len(held) == 20 and other is not None
        out = etcd_cluster().etcdctl("get", "--prefix", f"share{os.getpid()}/lock/", "-w", "json")
        leases = {kv["lease"] for kv in json.loads(out)["kvs"]}
        assert len(leases) == 2, "one lease per TTL, not one per lock"
        trips = locks.renewer.round_trips
        await asyncio.sleep(2.5)
        assert all(lock.held for lock in held)
        # ~2.5 s / (2 s / 3) renewal rounds, each one batch for all 21 locks.
        assert locks.renewer.round_trips - trips < 10
        for lock in [*held, other]:
            assert await lock.release() is True


async def test_waiters_share_one_watch_and_each_release_wakes_its_own_name() -> None:
    """300 waiters (100 names, three each) in one process: one etcd watch, not
    300 (their registrations used to be serial and outlast the call timeout);
    the first in each name's line waits on it, the other two in the line; and
    every waiter gets its lock in turn."""
    url = f"{etcd_cluster().url}?prefix=watch{os.getpid()}"
    names = [f"w{i}" for i in range(100)]
    async with LockService.from_url(url) as holders, LockService.from_url(url) as waiters:
        held = await holders.acquire_each(names, ttl=5)
        assert all(lock is not None for lock in held)
        order: list[str] = []

        async def wait_for(name: str) -> None:
            lock = await waiters.acquire(name, ttl=5, wait=30)
            assert lock is not None
            order.append(name)
            await asyncio.sleep(0.01)
            assert await lock.release()

        waiting = [asyncio.ensure_future(wait_for(name)) for name in names for _ in range(3)]
        store = waiters.store
        assert isinstance(store, EtcdStore)
        conn = await store.transport.conn()
        await until(
            lambda: all(waiters.waiting(name) == 3 for name in names), "every waiter in line"
        )
        await until(lambda: len(conn.releases.wakeups) == 100, "the first of each line watching")
        assert len(conn.watcher._callbacks) == 1, "one watch for all the waiters"
        assert await holders.release_each([lock for lock in held if lock is not None]) == [
            True
        ] * len(names)
        await asyncio.wait_for(asyncio.gather(*waiting), 60)
        assert sorted(order) == sorted(names * 3)


async def test_a_lease_etcd_reports_expired_marks_every_lock_on_it_lost() -> None:
    url = f"{etcd_cluster().url}?prefix=revoke{os.getpid()}"
    async with LockService.from_url(url) as locks, LockService.from_url(url) as other:
        maybe = [await locks.acquire(f"r{i}", ttl=1.5) for i in range(5)]
        held = [lock for lock in maybe if lock is not None]
        assert len(held) == 5
        waiter = asyncio.ensure_future(other.acquire("r0", ttl=1.5, wait=5))
        await asyncio.sleep(0.1)
        out = etcd_cluster().etcdctl("get", f"revoke{os.getpid()}/lock/r0", "-w", "json")
        lease = json.loads(out)["kvs"][0]["lease"]
        etcd_cluster().etcdctl("lease", "revoke", format(lease, "x"))
        got = await asyncio.wait_for(waiter, 5)
        assert got is not None, "the waiter was woken by the keys' deletion"
        await asyncio.sleep(1.0)  # the next renewal learns the lease is gone
        assert all(lock.lost for lock in held)
        assert "no longer has this lock's token" in (held[3].lost_reason or "")
        await got.release()


async def test_a_call_on_a_connection_another_caller_closed_is_not_a_cancel(
    cluster: EtcdCluster,
) -> None:
    """A call times out, marks the connection broken, and the next call closes
    it: every call still on it is cancelled by gRPC. Those callers get their
    answer (sent again on the new connection) or StoreUnavailable, never a
    CancelledError that would end their task as if it had been cancelled."""
    store = EtcdStore.from_url(f"{cluster.url}?prefix=closed&timeout=1")
    try:
        await store.holders()  # connected
        cluster.pause()
        try:
            timing_out = asyncio.ensure_future(store.holders())
            await asyncio.sleep(0.5)
            on_it = asyncio.ensure_future(store.holders())  # half its timeout to go
            with pytest.raises(StoreUnavailable):
                await timing_out  # the connection is broken
            first = await store.transport.conn()  # the next call's: the old channel closes
            await asyncio.sleep(0.05)
            assert not on_it.done() or not on_it.cancelled()
        finally:
            cluster.resume()
        assert await asyncio.wait_for(on_it, 10) == [], "answered on the new connection"
        assert first is await store.transport.conn()
    finally:
        await store.aclose()


def test_password_auth_and_a_wrong_password() -> None:
    cluster = EtcdCluster(members=1)
    try:
        cluster.enable_auth("pa55word")
        good = f"etcd://root:pa55word@{cluster.endpoints}"

        async def use(url: str) -> int:
            async with LockService.from_url(url) as locks:
                lock = await locks.acquire("auth", ttl=TTL)
                assert lock is not None
                await asyncio.sleep(0.5)  # renewed under the same credentials
                assert lock.held
                assert await lock.release()
                return lock.fencing_token

        assert asyncio.run(use(good)) > 0
        with pytest.raises(StoreUnavailable) as caught:
            asyncio.run(use(f"etcd://root:wrong@{cluster.endpoints}"))
        assert "authentication failed" in str(caught.value)
        assert "wrong" not in str(caught.value) and "pa55word" not in str(caught.value)
    finally:
        cluster.stop()


def test_tls(tmp_path: Path) -> None:
    certs = self_signed_cert(tmp_path)
    cluster = EtcdCluster(members=1, tls=certs)
    try:

        async def use(url: str) -> None:
            async with LockService.from_url(url) as locks:
                lock = await locks.acquire("tls", ttl=TTL)
                assert lock is not None
                assert await lock.release()

        asyncio.run(use(f"etcd://{cluster.endpoints}?ca={certs / 'cert.pem'}"))
        with pytest.raises(StoreUnavailable):  # plain text to a TLS server
            asyncio.run(use(f"etcd://{cluster.endpoints}?timeout=1"))
    finally:
        cluster.stop()


def _contend(url: str, tmp: Path, workers: int, iterations: int) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    resource = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.fenced"], stdout=subprocess.PIPE, text=True, env=env
    )
    assert resource.stdout is not None
    port = resource.stdout.readline().strip()
    procs: list[subprocess.Popen[bytes]] = [resource]  # type: ignore[list-item]
    for i in range(workers):
        procs.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "tests.faults.worker", url, "leader-lock"),
                    *(str(tmp / f"w{i}.jsonl"), port, str(iterations), str(TTL), "0.2"),
                ],
                env=env,
                cwd=ROOT,
            )
        )
    return procs


@pytest.mark.parametrize("fault", ["sigkill", "sigstop"])
def test_the_leader_killed_or_paused_during_contention(
    cluster: EtcdCluster, tmp_path: Path, fault: str
) -> None:
    """Three processes contend while the leader is SIGKILLed (or SIGSTOPped past
    the TTL): a new leader takes over, nobody is told it holds a lock another
    holds, and fencing tokens keep increasing."""
    procs = _contend(cluster.url, tmp_path, workers=3, iterations=8)
    try:
        time.sleep(1.0)  # contention under way
        leader = cluster.leader()
        if fault == "sigkill":
            cluster.kill_member(leader)
        else:
            cluster.signal(leader, signal.SIGSTOP)
        faulted_at = time.monotonic_ns()
        time.sleep(2 * TTL)
        new_leader = cluster.leader()
        assert new_leader != leader, "another member was elected"
        if fault == "sigstop":
            cluster.signal(leader, signal.SIGCONT)
        for proc in procs[1:]:
            assert proc.wait(120) == 0
        history = grants(read_logs(sorted(tmp_path.glob("w*.jsonl"))))
        assert violations(history) == []
        assert len(history) == 24
        assert any(g.granted > faulted_at for g in history), "grants went on after the fault"
        fences = [g.fence for g in sorted(history, key=lambda g: g.granted)]
        assert fences == sorted(fences)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if procs[0].stdout is not None:
            procs[0].stdout.close()


def test_the_whole_cluster_restarted_keeps_fencing_increasing(cluster: EtcdCluster) -> None:
    async def fence() -> int:
        async with LockService.from_url(cluster.url) as locks:
            for _ in range(50):  # the cluster may still be electing a leader
                try:
                    lock = await locks.acquire("restart", ttl=TTL)
                    break
                except StoreUnavailable:
                    await asyncio.sleep(0.1)
            assert lock is not None
            assert await lock.release()
            return lock.fencing_token

    before = asyncio.run(fence())
    cluster.restart()
    after = asyncio.run(fence())
    assert after > before
