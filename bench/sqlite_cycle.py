"""SQLite: tenure's acquire+release against a hand-written sqlite3 lease cycle.

Both run on the same kind of file (WAL, synchronous=NORMAL), side by side and
interleaved in rounds so that machine noise hits both alike. The hand-written
cycle is the least any SQLite lease can do: one upsert-if-expired statement to
take the lease and one compare-and-delete statement to give it back.

    python bench/sqlite_cycle.py [--n 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tenure import LockService


def time_sync(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


async def time_async(fn: Callable[[], Awaitable[None]], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n


def hand_written(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS lease (name TEXT PRIMARY KEY, token TEXT, expires INTEGER)"
    )
    return conn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="cycles per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="tenure-bench-"))
    conn = hand_written(directory / "hand.db")

    def hand_cycle() -> None:
        token = os.urandom(16).hex()
        now = time.monotonic_ns()
        rows = conn.execute(
            "INSERT INTO lease VALUES (?1, ?2, ?3 + 30000000000) ON CONFLICT (name) DO UPDATE"
            " SET token = excluded.token, expires = excluded.expires"
            " WHERE lease.token IS NULL OR lease.expires <= ?3 RETURNING 1",
            ("bench", token, now),
        ).fetchall()
        assert rows
        conn.execute(
            "UPDATE lease SET token = NULL, expires = 0 WHERE name = ?1 AND token = ?2",
            ("bench", token),
        )

    async def run() -> None:
        async with LockService.from_url(f"sqlite://{directory}/tenure.db") as locks:

            async def tenure_cycle() -> None:
                lock = await locks.acquire("bench")
                assert lock is not None
                await lock.release()

            hand: list[float] = []
            ours: list[float] = []
            for _ in range(args.rounds):
                hand.append(time_sync(hand_cycle, args.n))
                ours.append(await time_async(tenure_cycle, args.n))
            h, t = statistics.median(hand), statistics.median(ours)
            print(f"SQLite acquire+release, {args.rounds} rounds x {args.n} cycles (median):")
            print(f"  hand-written sqlite3 lease cycle   {h * 1e6:8.1f} µs   1.00x")
            print(f"  tenure acquire + release           {t * 1e6:8.1f} µs   {t / h:.2f}x")

    asyncio.run(run())


if __name__ == "__main__":
    main()
