"""The blocking API (tenure.sync): uncontended acquire+release against blocking peers.

Side by side, interleaved in rounds, in one run:

* SQLite: ``tenure.sync`` against a hand-written sqlite3 lease cycle (WAL,
  ``synchronous=NORMAL``; see bench/sqlite_cycle.py) and the asyncio API;
* Redis (a throwaway ``redis-server``, or ``--redis URL``): ``tenure.sync``
  against redis-py's blocking ``Lock`` and two blocking ``PING``s;
* PostgreSQL (a throwaway cluster, or ``--postgres URL``): ``tenure.sync``
  against two blocking ``SELECT 1`` and the hand-written lease cycle of
  bench/postgres_cycle.py on a blocking psycopg connection (autocommit,
  statements prepared).

    python bench/sync_cycle.py [--n 2000] [--rounds 7] [--redis redis://...]
                               [--postgres postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psycopg
import redis

import tenure
from rounds import time_sync
from tenure.sync import LockService

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import PostgresServer

from postgres_cycle import HAND_ACQUIRE, HAND_RELEASE, HAND_TABLE
from redis_cycle import redis_server
from sqlite_cycle import hand_written, lease_cycle


def sync_cycle(locks: LockService) -> Callable[[], None]:
    """One uncontended tenure.sync acquire+release."""

    def cycle() -> None:
        lock = locks.acquire("bench:sync")
        assert lock is not None
        lock.release()

    return cycle


def interleaved(
    contenders: Mapping[str, Callable[[], object]], n: int, rounds: int
) -> dict[str, list[float]]:
    """Each contender timed for ``n`` calls, one after the other, ``rounds`` times."""
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            results[name].append(time_sync(fn, n))
    return results


def report(title: str, results: dict[str, list[float]], floor: str) -> None:
    med = {name: statistics.median(values) for name, values in results.items()}
    print(title)
    for name, value in med.items():
        print(f"  {name:32s} {value * 1e6:8.1f} µs   {value / med[floor]:5.2f}x {floor}")


def sqlite(n: int, rounds: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="tenure-bench-"))
    hand_cycle = lease_cycle(hand_written(directory / "hand.db"))
    url = f"sqlite://{directory}/tenure.db"

    results: dict[str, list[float]] = {}
    with LockService.from_url(url) as locks:

        async def async_rounds() -> float:
            async with tenure.LockService.from_url(url) as alocks:
                start = time.perf_counter()
                for _ in range(n):
                    lock = await alocks.acquire("bench:async")
                    assert lock is not None
                    await lock.release()
                return (time.perf_counter() - start) / n

        contenders: dict[str, Callable[[], float]] = {
            "hand-written sqlite3 cycle": lambda: time_sync(hand_cycle, n),
            "tenure.sync acquire+release": lambda: time_sync(sync_cycle(locks), n),
            "tenure (asyncio) acquire+release": lambda: asyncio.run(async_rounds()),
        }
        for name in contenders:
            results[name] = []
        order = list(contenders)
        for _ in range(rounds):
            # Each round in another order: whoever runs right after the
            # hand-written cycle meets the disk busy with its checkpoint.
            order = order[1:] + order[:1]
            for name in order:
                results[name].append(contenders[name]())
    report(f"SQLite, {rounds} rounds x {n} (median):", results, floor="hand-written sqlite3 cycle")


def redis_cycles(url: str, n: int, rounds: int) -> None:
    client = redis.Redis.from_url(url)
    with LockService.from_url(url) as locks:

        def two_pings() -> None:
            client.ping()
            client.ping()

        def redis_py_lock() -> None:
            lock = client.lock("bench:redis-py", timeout=30)
            assert lock.acquire(blocking=False)
            lock.release()

        contenders = {
            "two PINGs (blocking)": two_pings,
            "redis-py Lock (blocking)": redis_py_lock,
            "tenure.sync acquire+release": sync_cycle(locks),
        }
        results = interleaved(contenders, n, rounds)
    client.close()
    report(f"Redis, {rounds} rounds x {n} (median):", results, floor="two PINGs (blocking)")


def postgres_cycles(url: str, n: int, rounds: int) -> None:
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    conn.execute(HAND_TABLE)
    with LockService.from_url(url) as locks:

        def two_selects() -> None:
            conn.execute("SELECT 1").fetchone()
            conn.execute("SELECT 1").fetchone()

        def hand_cycle() -> None:
            assert conn.execute(HAND_ACQUIRE, ("bench:hand", "t")).fetchone() is not None
            conn.execute(HAND_RELEASE, ("bench:hand", "t"))

        contenders = {
            "two SELECT 1 (blocking)": two_selects,
            "hand-written lease cycle": hand_cycle,
            "tenure.sync acquire+release": sync_cycle(locks),
        }
        results = interleaved(contenders, n, rounds)
    conn.close()
    title = f"PostgreSQL, {rounds} rounds x {n} (median):"
    report(title, results, floor="hand-written lease cycle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis", help="a Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: a throwaway cluster)")
    args = parser.parse_args()
    sqlite(args.n, args.rounds)
    if args.redis:
        redis_cycles(args.redis, args.n, args.rounds)
    else:
        with redis_server() as url:
            redis_cycles(url, args.n, args.rounds)
    if args.postgres:
        postgres_cycles(args.postgres, args.n, args.rounds)
    else:
        server = PostgresServer()
        try:
            postgres_cycles(server.url(), args.n, args.rounds)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
