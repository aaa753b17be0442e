"""Injected faults against real worker processes, judged by the history checker.

Each scenario runs on every store that several processes can share, with a
TTL of one second, and proves that its fault bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tenure.lease import safety_margin
from tenure.stores import from_url

from ..conftest import STORES, StoreKind, etcd_cluster, postgres_server, redis_server
from ..helpers.procs import ROOT
from ..servers import EtcdCluster, PostgresServer, RedisServer
from .fenced import Resource
from .history import Grant, grants, read_logs, violations
from .proxy import Proxy

TTL = 1.0


class Run:
    """A fenced resource process and the workers of one scenario."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.resource = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.fenced"],
            stdout=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=ROOT,
        )
        assert self.resource.stdout is not None
        self.port = int(self.resource.stdout.readline())
        self.workers: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        count: int,
        iterations: int,
        *,
        hold: float = 0.05,
        url: str | None = None,
        tasks: int = 1,
        wall_step: float = 0.0,
        kind: str = "lock",
        ttl: float = TTL,
    ) -> None:
        """Start ``count`` workers; ``url``: another way to the same store (a proxy);
        ``tasks``: workers inside each process; ``wall_step``: seconds by which each
        steps its wall clock after its first grant; ``kind``: what they take, a lock,
        ``semaphore:N`` or ``election`` (see worker.py); ``ttl``: their leases'."""
        env = dict(self.env, TENURE_FAULT_WALL_STEP=str(wall_step), TENURE_FAULT_KIND=kind)
        for _ in range(count):
            name = f"w{len(self.workers)}"
            self.workers[name] = subprocess.Popen(
                [
                    sys.executable,
                    *("-m", "tests.faults.worker", url or self.url, "fault-lock"),
                    str(self.tmp / f"{name}.jsonl"),
                    *(str(self.port), str(iterations), str(ttl), str(hold), str(tasks)),
                ],
                env=env,
                cwd=ROOT,
            )

    def log(self, worker: str) -> Path:
        return self.tmp / f"{worker}.jsonl"

    def logs(self) -> list[Path]:
        """Every worker's log, the in-process workers' (``w0-1.jsonl`` ...) too."""
        return sorted(self.tmp.glob("w*.jsonl"))

    def wait_for(self, worker: str, op: str, timeout: float = 30) -> dict[str, Any]:
        """Block until ``worker`` logs an ``op`` event (an acquire that was granted); it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log(worker).exists():
                [mine] = read_logs([self.log(worker)]).values()
                for event in mine:
                    if event["op"] == op and event.get("fence", 0) is not None:
                        return event
            time.sleep(0.005)
        raise TimeoutError(f"{worker} never logged {op!r}")

    def wait_until_holding(self, worker: str) -> int:
        """Block until ``worker`` was granted the lock; its fence."""
        return int(self.wait_for(worker, "acquire")["fence"])

    def finish(self, timeout: float = 120) -> list[Grant]:
        for proc in self.workers.values():
            proc.wait(timeout)
        return grants(read_logs(self.logs()))

    def exit_codes(self) -> dict[str, int | None]:
        return {name: proc.returncode for name, proc in self.workers.items()}

    def stats(self) -> tuple[int, int, int]:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(b"stats\n")
            value, accepted, rejected = sock.makefile().readline().split()
        return int(value), int(accepted), int(rejected)

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
        self.resource.kill()
        self.resource.wait()
        if self.resource.stdout is not None:
            self.resource.stdout.close()


@pytest.fixture
def run(shared_url: str, tmp_path: Path) -> Iterator[Run]:
    scenario = Run(shared_url, tmp_path)
    yield scenario
    scenario.close()


def test_no_fault_six_processes(run: Run, soak: int) -> None:
    run.start(6, iterations=6 * soak)
    history = run.finish(timeout=120 * soak)
    assert violations(history) == []
    assert len(history) == 36 * soak, f"workers' exit codes: {run.exit_codes()}"
    unreleased = [g for g in history if not g.released]
    assert unreleased == [], "every grant was still held at its release"
    value, accepted, rejected = run.stats()
    assert (value, accepted, rejected) == (36 * soak,) * 2 + (0,), "no lost update, nothing stale"
    waits = sorted(g.granted - g.requested for g in history)
    assert waits[-1] > 20_000_000, f"contended: some acquire waited for a release ({waits} ns)"


def test_no_fault_six_tasks_on_the_memory_store(tmp_path: Path, soak: int) -> None:
    """The memory store lives in one process, so its contenders are tasks of that
    process; the faults of the other scenarios (a paused, killed or cut-off holder
    or store) take the memory store down with them and do not apply."""
    scenario = Run(STORES["memory"].make_url(tmp_path), tmp_path)
    try:
        scenario.start(1, iterations=6 * soak, tasks=6)
        history = scenario.finish(timeout=120 * soak)
        assert len(scenario.logs()) == 6
        assert violations(history) == []
        assert len(history) == 36 * soak and all(g.released for g in history)
        assert scenario.stats() == (36 * soak,) * 2 + (0,), "no lost update, nothing stale"
        assert max(g.granted - g.requested for g in history) > 20_000_000, "contended"
    finally:
        scenario.close()


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["ahead", "behind"])
def test_holder_wall_clock_stepped_by_an_hour(run: Run, step: float) -> None:
    """Lease time is the store's clock or this host's monotonic clock, never the
    wall clock: a holder whose wall clock jumps an hour keeps renewing its lease
    and holds it to its release, and nobody else is granted it meanwhile."""
    run.start(1, iterations=1, hold=3 * TTL, wall_step=step)
    run.wait_until_holding("w0")
    run.start(2, iterations=2)
    history = run.finish()
    [mine] = read_logs([run.log("w0")]).values()
    [stepped] = [e for e in mine if e["op"] == "wallstep"]
    assert abs(stepped["after"] - stepped["before"] - step) < 1, "the wall clock jumped"
    assert violations(history) == []
    [held] = [g for g in history if g.worker == "w0"]
    assert held.released is True, "still the holder at its release"
    assert held.end - stepped["t"] > 2.5 * TTL * 1e9, "renewed well past the step"
    assert all(c["held"] for c in held.checks)
    assert min(g.granted for g in history if g.worker != "w0") > held.end
    assert run.stats() == (5, 5, 0)


@pytest.mark.parametrize("kind", ["lock", "election"])
def test_holder_paused_past_twice_the_ttl(run: Run, kind: str) -> None:
    """``election``: the same with terms (the paused leader's write is refused by
    its term number)."""
    run.start(1, iterations=1, hold=0.3, kind=kind)
    run.wait_until_holding("w0")
    run.start(3, iterations=3, kind=kind)
    paused_at = time.monotonic_ns()
    os.kill(run.workers["w0"].pid, signal.SIGSTOP)
    time.sleep(2.5 * TTL)
    resumed_at = time.monotonic_ns()
    os.kill(run.workers["w0"].pid, signal.SIGCONT)
    history = run.finish()
    assert resumed_at - paused_at > 2 * TTL * 1e9, "the pause outlasted twice the TTL"
    assert violations(history) == []
    [paused] = [g for g in history if g.worker == "w0"]
    during = [g for g in history if g.worker != "w0" and paused_at < g.granted < resumed_at]
    assert during, "another process got the lock while the holder was paused"
    assert paused.released is False, "the paused holder's late release was a no-op"
    value, accepted, rejected = run.stats()
    assert value == accepted == len(history) - 1, "the stale write was refused, none lost"
    assert rejected >= 1


@pytest.mark.parametrize("kind", ["lock", "election"])
def test_holder_killed_frees_the_lock_within_the_ttl(run: Run, kind: str) -> None:
    """``election``: a leader SIGKILLed, a campaigning standby elected."""
    run.start(1, iterations=1, hold=5.0, kind=kind)
    run.wait_until_holding("w0")
    run.start(2, iterations=2, kind=kind)
    time.sleep(0.2)  # the others are waiting on it
    killed_at = time.monotonic_ns()
    run.workers["w0"].kill()
    history = run.finish()
    assert violations(history) == []
    [victim] = [g for g in history if g.worker == "w0"]
    assert victim.released is None, "it died holding the lock"
    after = min(g.granted for g in history if g.worker != "w0")
    assert after > killed_at, "nobody else had it before the kill"
    assert after - killed_at < (TTL + 1.0) * 1e9
    fences = [g.fence for g in sorted(history, key=lambda g: g.granted)]
    assert fences == sorted(fences), "fencing tokens (term numbers) rise in grant order"
    value, accepted, _ = run.stats()
    assert value == accepted == 4


def _grant(worker: str, fence: int, requested: int, granted: int, end: int) -> Grant:
    return Grant(worker, fence, requested, granted, end, released=True)


def test_the_checker_finds_what_it_is_for() -> None:
    fine = [_grant("a", 1, 0, 10, 20), _grant("b", 2, 5, 25, 40)]
    assert violations(fine) == []
    overlap = [_grant("a", 1, 0, 10, 30), _grant("b", 2, 5, 25, 40)]
    assert any("overlap" in v for v in violations(overlap))
    repeated = [_grant("a", 3, 0, 10, 20), _grant("b", 3, 21, 25, 40)]
    assert any("twice" in v for v in violations(repeated))
    backwards = [_grant("a", 5, 0, 10, 20), _grant("b", 4, 21, 25, 40)]
    assert any("smaller token" in v for v in violations(backwards))
    three = [_grant("a", 1, 0, 10, 30), _grant("b", 2, 5, 12, 30), _grant("c", 3, 6, 14, 30)]
    assert violations(three, limit=3) == []
    assert any("3 permits were held at once" in v for v in violations(three, limit=2))
    told = _grant("a", 1, 0, 10, 20)
    told.checks.append({"t": 20, "held": True, "deadline": 20})
    assert any("past its deadline" in v for v in violations([told]))


def test_the_resource_refuses_stale_fences() -> None:
    resource = Resource()
    assert resource.handle("read 5") == "ok 0"
    assert resource.handle("write 5 1") == "ok"
    assert resource.handle("read 4") == "stale 5"
    assert resource.handle("write 6 2") == "ok"
    assert resource.handle("stats") == "2 2 1"


@pytest.mark.parametrize("down_for", [0.0, 1.5 * TTL], ids=["at-once", "after-a-ttl"])
@pytest.mark.parametrize("store", ["redis", "postgres", "etcd"])
def test_store_killed_and_restarted(store: str, down_for: float, tmp_path: Path) -> None:
    """PostgreSQL and etcd (every member killed) keep every lease through a
    restart. Redis without persistence
    forgets them: restarted at once, a second process acquires while the first
    still holds, and the checker must see that overlap (the fenced resource still
    refuses the stale write); restarted after a TTL, the holder had already given
    the lock up at its deadline."""
    server: RedisServer | PostgresServer | EtcdCluster
    if store == "redis":
        server = RedisServer()
        url = server.url
    elif store == "etcd":
        server = EtcdCluster()
        url = server.url
    else:
        server = PostgresServer()
        url = server.url()
    scenario = Run(url, tmp_path)
    try:
        scenario.start(1, iterations=1, hold=3 * TTL)
        scenario.wait_until_holding("w0")
        time.sleep(0.2)
        killed_at = time.monotonic_ns()
        if down_for:
            server._kill()
            time.sleep(down_for)
            server.start()
        else:
            server.restart()
        restarted_at = time.monotonic_ns()
        scenario.start(1, iterations=1)
        history = scenario.finish()
        found = violations(history)
        [first] = [g for g in history if g.worker == "w0"]
        [second] = [g for g in history if g.worker == "w1"]
        assert restarted_at - killed_at >= down_for * 1e9, "the server really was down"
        value, accepted, rejected = scenario.stats()
        if store == "redis" and not down_for:
            assert found and all("overlap" in v for v in found), found
            assert second.granted < first.end, "the forgotten lease was granted again"
            assert second.fence > first.fence, "yet fencing still increases"
            assert first.released is False
            assert (value, accepted, rejected) == (1, 1, 1), "the stale write was refused"
        else:
            assert found == []
            # The holder renews every TTL/3 and trusts its lease until TTL minus
            # the margin: a restart shorter than the difference is one it rides
            # through. A slower one (crash recovery on a loaded host) makes it
            # give the lock up at its deadline instead, which the checker has
            # just found harmless.
            tolerance = (TTL - safety_margin(TTL) - TTL / 3) * 1e9
            if store != "redis" and not down_for and restarted_at - killed_at < tolerance:
                assert first.released is True, "the lease survived: released as held"
                assert second.granted > first.end
            assert value == accepted
    finally:
        scenario.close()
        server.stop()


def test_store_paused_for_one_and_a_half_ttls(run: Run, shared_kind: StoreKind) -> None:
    """The holder cannot renew while the store is paused: it must stop trusting its
    lease at its local deadline, before anyone else can be granted the lock."""
    run.start(1, iterations=1, hold=2.5 * TTL)
    run.wait_until_holding("w0")
    run.start(2, iterations=2)
    for worker in ("w1", "w2"):
        run.wait_for(worker, "ready")  # opened their store before the outage
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
    assert violations(history) == []
    [held] = [g for g in history if g.worker == "w0"]
    assert paused_at < held.end < resumed_at, "the holder gave the lock up during the pause"
    assert held.released is False
    assert min(g.granted for g in history if g.worker != "w0") > held.end
    value, accepted, rejected = run.stats()
    assert value == accepted == len(history) - 1, "the holder's late write was refused"
    assert rejected >= 1


@contextlib.contextmanager
def through_a_proxy(
    store: str, tmp_path: Path, postgres_options: str = ""
) -> Iterator[tuple[Run, Proxy, str]]:
    """A scenario on the session's Redis or PostgreSQL, a proxy in front of it,
    and the URL that reaches the store through the proxy."""
    prefix = f"t{uuid.uuid4().hex[:12]}"
    if store == "redis":
        url = f"{redis_server().url}?prefix={prefix}"
    elif store == "etcd":
        url = f"{etcd_cluster().url}?prefix={prefix}"
    else:
        url = f"{postgres_server().url()}?prefix={prefix}{postgres_options}"
    port = int(url.split("://", 1)[1].split(",")[0].split("/")[0].split("?")[0].rsplit(":", 1)[1])
    proxy = Proxy(port)
    scenario = Run(url, tmp_path)
    if store == "etcd":  # the holder reaches one member, through the proxy
        through = f"etcd://127.0.0.1:{proxy.port}?prefix={prefix}"
    else:
        through = url.replace(f":{port}/", f":{proxy.port}/")
    try:
        yield scenario, proxy, through
    finally:
        scenario.close()
        proxy.close()


@pytest.mark.parametrize("kind", ["lock", "election"])
@pytest.mark.parametrize("store", ["redis", "postgres", "etcd"])
def test_holder_cut_off_past_its_ttl_then_healed(store: str, kind: str, tmp_path: Path) -> None:
    """A partition between the holder and the store: its renewals vanish, the store
    expires its lease and grants it to another; once healed, the holder's stale
    write is refused and its release is a no-op, and the new holder is untouched.
    ``election``: the same with a leader and its term."""
    with through_a_proxy(store, tmp_path) as (scenario, proxy, through_proxy):
        scenario.start(1, iterations=1, hold=3.5 * TTL, url=through_proxy, kind=kind)
        scenario.wait_until_holding("w0")
        scenario.start(2, iterations=2, kind=kind)
        for worker in ("w1", "w2"):
            scenario.wait_for(worker, "ready")
        cut_at = time.monotonic_ns()
        proxy.set_mode("blackhole")
        time.sleep(2 * TTL)
        proxy.set_mode("pass")
        healed_at = time.monotonic_ns()
        history = scenario.finish()
        assert proxy.dropped > 0, "the partition swallowed the holder's traffic"
        assert violations(history) == []
        [cut] = [g for g in history if g.worker == "w0"]
        others = [g for g in history if g.worker != "w0"]
        assert any(cut_at < g.granted < healed_at for g in others), "granted during the cut"
        assert cut.end < min(g.granted for g in others)
        assert cut.released is False, "the healed holder's release failed its compare-and-set"
        assert all(g.released for g in others), "the new holders were untouched"
        value, accepted, rejected = scenario.stats()
        assert value == accepted == len(others)
        assert rejected >= 1, "the healed holder's stale write was refused"


def test_the_proxy_passes_delays_drops_and_resets() -> None:
    echo = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        echo.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = echo.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):  # the proxy's reset reaches here too
                while data := conn.recv(1024):
                    conn.sendall(data)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    proxy = Proxy(echo.getsockname()[1])
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as client:
            client.sendall(b"ping")
            assert client.recv(16) == b"ping"
            proxy.set_mode("delay", delay=0.3)
            started = time.monotonic()
            client.sendall(b"slow")
            assert client.recv(16) == b"slow"
            assert time.monotonic() - started >= 0.3
            proxy.set_mode("blackhole")
            time.sleep(0.05)
            client.sendall(b"lost")
            client.settimeout(0.3)
            with pytest.raises(TimeoutError):
                client.recv(16)
            assert proxy.dropped == 4
            proxy.set_mode("reset")
            time.sleep(0.05)
            client.settimeout(2)
            with pytest.raises(ConnectionResetError):
                client.recv(16)
    finally:
        proxy.close()
        stop.set()
        server.join()
        echo.close()


# Not etcd: there the holder's keep-alives, delayed as much as its release, keep
# extending the lease until after the release arrives, so the fault does not
# reliably happen (the stale release's compare-and-set is the contract suite's
# test_stale_release_and_renew_are_no_ops[etcd]).
@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_a_delayed_release_replayed_after_a_new_grant(store: str, tmp_path: Path) -> None:
    """The network holds the holder's renewals and its release back for longer
    than its TTL: the lease expires, another process is granted the lock, and
    the late release arrives after that grant. It must fail its compare-and-set
    and leave the new holder untouched."""
    # psycopg prepares a statement on its first use with a round trip of its
    # own: the release then takes two delayed round trips, over the default 2 s.
    with through_a_proxy(store, tmp_path, postgres_options="&timeout=5") as (
        scenario,
        proxy,
        through_proxy,
    ):
        scenario.start(1, iterations=1, hold=0.5 * TTL, url=through_proxy)
        scenario.wait_until_holding("w0")
        # 0.9 s each way: a round trip of 1.8 s, longer than the TTL and still
        # under the stores' statement timeouts, so the late answers come.
        proxy.set_mode("delay", delay=0.9 * TTL)
        scenario.start(2, iterations=2)
        history = scenario.finish()
        assert violations(history) == []
        [late] = [g for g in history if g.worker == "w0"]
        others = [g for g in history if g.worker != "w0"]
        assert late.release_answered is not None
        # The fault bit: the release spent over a TTL in the network, and another
        # process was granted the lock while it was on its way.
        assert late.release_answered - late.end > 1.4 * TTL * 1e9
        assert any(late.end < g.granted < late.release_answered for g in others)
        assert late.released is False, "the replayed release failed its compare-and-set"
        assert all(g.released for g in others), "the new holders were untouched"
        value, accepted, _ = scenario.stats()
        assert value == accepted
