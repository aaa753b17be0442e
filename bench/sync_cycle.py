"""The blocking API (tenure.sync): uncontended acquire+release against blocking peers.

Side by side, interleaved in rounds, in one run:

* SQLite: ``tenure.sync`` against a hand-written sqlite3 lease cycle (WAL,
  ``synchronous=NORMAL``; see bench/sqlite_cycle.py) and the asyncio API;
* Redis (a throwaway ``redis-server``, or ``--redis URL``): ``tenure.sync``
  against redis-py's blocking ``Lock`` and two blocking ``PING``s;
* PostgreSQL (a throwaway cluster, or ``--postgres URL``): ``tenure.sync``
  against two blocking ``SELECT 1`` and the hand-written lease cycle of
  bench/postgres_cycle.py on a blocking psycopg connection (autocommit,
  statements prepared);
* MySQL/MariaDB (a throwaway ``mariadbd``, or ``--mysql URL``): ``tenure.sync``
  (its plain calls through PyMySQL) against two blocking ``SELECT 1`` and the
  hand-written lease cycle of bench/mysql_cycle.py on a PyMySQL connection
  (autocommit).

    python bench/sync_cycle.py [--n 2000] [--rounds 7] [--redis redis://...]
                               [--postgres postgresql://...] [--mysql mysql://...]
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
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pymysql
import redis

import tenure
from rounds import time_sync
from tenure.sync import LockService

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.mysql_server import MariaDBServer
from tests.servers import PostgresServer

import mysql_cycle
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


def sql_rounds(
    title: str,
    two_selects: Callable[[], None],
    hand_cycle: Callable[[], None],
    locks: LockService,
    *,
    n: int,
    rounds: int,
) -> None:
    """A SQL store's round: its floor (two round trips), the hand-written
    lease cycle on the same connection kind, and tenure.sync."""
    contenders = {
        "two SELECT 1 (blocking)": two_selects,
        "hand-written lease cycle": hand_cycle,
        "tenure.sync acquire+release": sync_cycle(locks),
    }
    results = interleaved(contenders, n, rounds)
    report(f"{title}, {rounds} rounds x {n} (median):", results, floor="hand-written lease cycle")


def on_server(url: str | None, server: Callable[[], Any], run: Callable[[str], None]) -> None:
    """``run(url)``, or on a throwaway server that ``server()`` starts."""
    if url:
        run(url)
        return
    made = server()
    try:
        run(made.url())
    finally:
        made.stop()


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

        sql_rounds("PostgreSQL", two_selects, hand_cycle, locks, n=n, rounds=rounds)
    conn.close()


def mysql_cycles(url: str, n: int, rounds: int) -> None:
    parts = urlsplit(url)
    conn = pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/"),
        autocommit=True,
    )
    with conn.cursor() as cur:
        cur.execute(mysql_cycle.HAND_TABLE)
    with LockService.from_url(url) as locks, conn.cursor() as cur:

        def two_selects() -> None:
            cur.execute("SELECT 1")
            cur.fetchone()
            cur.execute("SELECT 1")
            cur.fetchone()

        def hand_cycle() -> None:
            cur.execute(mysql_cycle.HAND_ACQUIRE, ("bench:hand", "t"))
            assert cur.rowcount > 0
            cur.execute(mysql_cycle.HAND_RELEASE, ("bench:hand", "t"))

        sql_rounds("MySQL/MariaDB", two_selects, hand_cycle, locks, n=n, rounds=rounds)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--redis", help="a Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--mysql", help="a MySQL/MariaDB URL (default: a throwaway mariadbd)")
    args = parser.parse_args()
    sqlite(args.n, args.rounds)
    if args.redis:
        redis_cycles(args.redis, args.n, args.rounds)
    else:
        with redis_server() as url:
            redis_cycles(url, args.n, args.rounds)
    on_server(args.postgres, PostgresServer, lambda url: postgres_cycles(url, args.n, args.rounds))
    on_server(args.mysql, MariaDBServer, lambda url: mysql_cycles(url, args.n, args.rounds))


if __name__ == "__main__":
    main()
