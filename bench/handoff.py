"""Release-to-waiter handoff latency between two processes, on any store.

One process holds a lock; another waits for it with ``wait=``. The holder
notes ``time.monotonic_ns()`` (one clock for every process of a Linux host)
just before it releases; the waiter notes it just after its acquire returns.
The difference is the handoff: the release, whatever wakes the waiter, and,
where the store does not grant on release, the waiter's acquire.

    python bench/handoff.py [--n 200] [--url URL]     (default: a temporary SQLite file)
    python bench/handoff.py --redis                    (a throwaway redis-server)
    python bench/handoff.py --postgres [--fsync]       (a throwaway PostgreSQL cluster)
    python bench/handoff.py --etcd                     (a throwaway three-member etcd cluster)
    python bench/handoff.py --mysql [--fsync]          (a throwaway MariaDB server; with
                                                       --postgres too: both, in one run)

On Redis, python-redis-lock (whose waiters block in BLPOP) is measured the same
way in the same run, in alternating rounds (``--rounds``, the order swapped
each round), so that a noisy host weighs on both alike; the ratio of the two
medians is printed per round.

On PostgreSQL the floor is measured the same way: one durable commit that
notifies (an ``UPDATE ... pg_notify``) and its NOTIFY's arrival at a process
that LISTENs, timed from just before the commit to the arrival; that is what a
release that grants the lock to the waiter costs at least. ``--fsync`` runs the
server with ``fsync=on`` (production's setting; the tests' server has it off).

On MySQL/MariaDB (no LISTEN/NOTIFY) a waiter in another process reads the
lease every 20 ms: its handoff is that poll, beside PostgreSQL's
notification when both are asked for. ``--fsync`` runs MariaDB with
``innodb_flush_log_at_trx_commit=1``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from tenure import LockService


def waiter(url: str, n: int, pipe: Connection) -> None:
    async def run() -> None:
        async with LockService.from_url(url) as locks:
            pipe.send("ready")
            for _ in range(n):
                pipe.recv()  # the holder has the lock
                lock = await locks.acquire("handoff", ttl=5, wait=10)
                got = time.monotonic_ns()
                assert lock is not None
                await lock.release()
                pipe.send(got)

    asyncio.run(run())


def peer_waiter(url: str, n: int, pipe: Connection) -> None:
    import redis
    import redis_lock

    client = redis.Redis.from_url(url)
    pipe.send("ready")
    for _ in range(n):
        pipe.recv()
        lock = redis_lock.Lock(client, "handoff-peer", expire=5)
        assert lock.acquire(blocking=True, timeout=5)
        got = time.monotonic_ns()
        lock.release()
        pipe.send(got)


def peer_holder(url: str, n: int, pipe: Connection) -> list[float]:
    import redis
    import redis_lock

    client = redis.Redis.from_url(url)
    latencies: list[float] = []
    for _ in range(n):
        lock = redis_lock.Lock(client, "handoff-peer", expire=5)
        assert lock.acquire(blocking=True, timeout=5)
        pipe.send("go")
        time.sleep(0.005)
        released = time.monotonic_ns()
        lock.release()
        latencies.append((pipe.recv() - released) / 1e6)
    return latencies


def floor_listener(url: str, n: int, pipe: Connection) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN handoff_floor")
        pipe.send("ready")
        for _ in conn.notifies(stop_after=n):
            pipe.send(time.monotonic_ns())


def run_floor(url: str, n: int) -> list[float]:
    """A durable commit with a NOTIFY, to its arrival at a LISTENing process, ms."""
    import psycopg

    latencies: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS handoff_floor (id int PRIMARY KEY, v bigint)")
        conn.execute("INSERT INTO handoff_floor VALUES (1, 0) ON CONFLICT DO NOTHING")
        ours, theirs = mp.get_context("spawn").Pipe()
        proc = mp.get_context("spawn").Process(target=floor_listener, args=(url, n, theirs))
        proc.start()
        assert ours.recv() == "ready"
        for _ in range(n):
            time.sleep(0.005)
            sent = time.monotonic_ns()
            conn.execute(
                "UPDATE handoff_floor SET v = v + 1 WHERE id = 1"
                " RETURNING pg_notify('handoff_floor', '')"
            )
            latencies.append((ours.recv() - sent) / 1e6)
        proc.join()
    return latencies


def report(label: str, latencies: list[float]) -> None:
    latencies = sorted(latencies)

    def p(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    print(
        f"  {label:28s} median {statistics.median(latencies):6.2f} ms   p90 {p(0.9):6.2f} ms"
        f"   p99 {p(0.99):6.2f} ms"
    )


async def holder(url: str, n: int, pipe: Connection) -> list[float]:
    latencies: list[float] = []
    async with LockService.from_url(url) as locks:
        for _ in range(n):
            lock = await locks.acquire("handoff", ttl=5, wait=10)
            assert lock is not None
            pipe.send("go")
            await asyncio.sleep(0.005)  # let the waiter block
            released = time.monotonic_ns()
            await lock.release()
            got = await asyncio.to_thread(pipe.recv)
            latencies.append((got - released) / 1e6)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="handoffs (per library on Redis)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds on Redis")
    parser.add_argument("--url", help="store URL (default: a temporary SQLite file)")
    for flag, what in (("--redis", "redis-server"), ("--postgres", "PostgreSQL cluster")):
        parser.add_argument(
            flag, action="store_true", help=f"start a throwaway {what} (the tests')"
        )
    parser.add_argument(
        "--etcd", action="store_true", help="start a throwaway etcd cluster (the tests')"
    )
    parser.add_argument(
        "--mysql", action="store_true", help="start a throwaway MariaDB server (the tests')"
    )
    parser.add_argument(
        "--fsync",
        action="store_true",
        help="PostgreSQL with fsync=on, MariaDB with innodb_flush_log_at_trx_commit=1",
    )
    parser.add_argument(
        "--chart", type=Path, metavar="SVG", help="draw the latencies as a histogram"
    )
    args = parser.parse_args()
    if args.mysql:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.mysql_server import MariaDBServer

        mysql = MariaDBServer(durable=args.fsync)
        try:
            series = measure(mysql.url(), args.n, args.rounds)
        finally:
            mysql.stop()
        if not args.postgres:
            return
    if args.redis or args.postgres or args.etcd:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.servers import EtcdCluster, PostgresServer, RedisServer

        server: RedisServer | PostgresServer | EtcdCluster
        if args.redis:
            server = RedisServer()
            url = server.url
        elif args.postgres:
            server = PostgresServer(fsync=args.fsync)
            url = server.url()
        else:
            server = EtcdCluster()
            url = server.url
        try:
            series = measure(url, args.n, args.rounds)
        finally:
            server.stop()
    else:
        url = args.url or f"sqlite://{tempfile.mkdtemp(prefix='tenure-bench-')}/handoff.db"
        series = measure(url, args.n, args.rounds)
    if args.chart is not None:
        from charts import histograms

        scheme = url.split(":", maxsplit=1)[0]
        setting = " (fsync=on)" if args.fsync else ""
        histograms(
            args.chart,
            f"Handoff to a waiting process, {scheme}{setting}",
            "ms",
            series,
            note="release sent to the waiter's grant; bench/handoff.py",
        )
        print(f"chart: {args.chart}")


def run_tenure(url: str, n: int) -> list[float]:
    ours, theirs = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=waiter, args=(url, n, theirs))
    proc.start()
    assert ours.recv() == "ready"
    latencies = asyncio.run(holder(url, n, ours))
    proc.join()
    return latencies


def run_peer(url: str, n: int) -> list[float]:
    ours, theirs = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=peer_waiter, args=(url, n, theirs))
    proc.start()
    assert ours.recv() == "ready"
    latencies = peer_holder(url, n, ours)
    proc.join()
    return latencies


def measure(url: str, n: int, rounds: int) -> dict[str, list[float]]:
    """Measure and print; the latencies (ms) by contender."""
    scheme = url.split(":", maxsplit=1)[0]
    if url.startswith(("postgres://", "postgresql://")):
        return against(url, n, rounds, run_floor, "commit + NOTIFY")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        print(f"handoff to a waiting process on {scheme}, {n} handoffs:")
        latencies = run_tenure(url, n)
        report("tenure", latencies)
        return {"tenure": latencies}
    return against(url, n, rounds, run_peer, "python-redis-lock (BLPOP)")


def against(
    url: str, n: int, rounds: int, other: Callable[[str, int], list[float]], label: str
) -> dict[str, list[float]]:
    """tenure's handoff and ``other``'s in alternating rounds, the order swapped each round."""
    scheme = url.split(":", maxsplit=1)[0]
    per_round = max(1, n // rounds)
    ours: list[float] = []
    theirs: list[float] = []
    ratios: list[float] = []
    for i in range(rounds):
        if i % 2:
            peer, mine = other(url, per_round), run_tenure(url, per_round)
        else:
            mine, peer = run_tenure(url, per_round), other(url, per_round)
        ours += mine
        theirs += peer
        ratios.append(statistics.median(mine) / statistics.median(peer))
    print(f"handoff to a waiting process on {scheme}, {rounds} alternating rounds of {per_round}:")
    report("tenure", ours)
    report(label, theirs)
    shown = " ".join(f"{r:.2f}" for r in ratios)
    print(f"  tenure / {label}, median per round: {shown}")
    print(f"  (median of the rounds: {statistics.median(ratios):.2f}x)")
    return {"tenure": ours, label: theirs}


if __name__ == "__main__":
    main()
