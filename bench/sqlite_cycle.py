"""SQLite: tenure's acquire+release against a hand-written sqlite3 lease cycle.

All run on the same kind of file (WAL, synchronous=NORMAL), side by side and
interleaved in rounds so that machine noise hits them alike. The hand-written
cycle is the least any SQLite lease can do: one upsert-if-expired statement to
take the lease and one compare-and-delete statement to give it back.

It runs twice: on SQLite's defaults (4 KB pages; the commit that takes the WAL
past 1000 pages checkpoints it, fsyncs included: the target's baseline), and on
the file settings tenure's SQLite store chooses (1 KB pages; the WAL
checkpointed on a thread of its own every 200 commits). The second is the
like-for-like floor: what tenure costs over the same statements on the same
kind of file.

    python bench/sqlite_cycle.py [--n 2000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from rounds import time_async, time_sync
from tenure import LockService
from tenure.stores.sqlite.schema import INLINE_CHECKPOINT_PAGES as _INLINE_CHECKPOINT_PAGES
from tenure.stores.sqlite.schema import PAGE_SIZE


def hand_written(path: Path, page_size: int = 4096) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS lease (name TEXT PRIMARY KEY, token TEXT, expires INTEGER)"
    )
    return conn


def checkpoint_in_background(path: Path) -> Callable[[], None]:
    """A hand-written version of tenure's WAL checkpoint thread; returns "one more commit"."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    wanted = threading.Event()
    commits = 0

    def serve() -> None:
        while True:
            wanted.wait()
            wanted.clear()
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    threading.Thread(target=serve, daemon=True).start()

    def committed() -> None:
        nonlocal commits
        commits += 1
        if commits % 200 == 0:
            wanted.set()

    return committed


def lease_cycle(
    conn: sqlite3.Connection, committed: Callable[[], None] | None = None
) -> Callable[[], None]:
    """One hand-written acquire+release on ``conn``."""

    def cycle() -> None:
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
        if committed is not None:
            committed()
            committed()

    return cycle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="cycles per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="tenure-bench-"))
    hand_cycle = lease_cycle(hand_written(directory / "hand.db"))
    background = directory / "hand-bg.db"
    conn = hand_written(background, page_size=PAGE_SIZE)
    conn.execute(f"PRAGMA wal_autocheckpoint = {_INLINE_CHECKPOINT_PAGES}")  # as in the store
    hand_bg_cycle = lease_cycle(conn, checkpoint_in_background(background))

    async def run() -> None:
        async with LockService.from_url(f"sqlite://{directory}/tenure.db") as locks:

            async def tenure_cycle() -> None:
                lock = await locks.acquire("bench")
                assert lock is not None
                await lock.release()

            hand: list[float] = []
            hand_bg: list[float] = []
            ours: list[float] = []

            async def hand_round() -> float:
                return time_sync(hand_cycle, args.n)

            async def hand_bg_round() -> float:
                return time_sync(hand_bg_cycle, args.n)

            runs: list[tuple[list[float], Callable[[], Awaitable[float]]]] = [
                (hand, hand_round),
                (hand_bg, hand_bg_round),
                (ours, lambda: time_async(tenure_cycle, args.n)),
            ]
            for _ in range(args.rounds):
                # Each round in another order: whoever runs right after the
                # hand-written cycle meets the disk busy with its checkpoint.
                runs = runs[1:] + runs[:1]
                for results, run_once in runs:
                    results.append(await run_once())
            h, b, t = (statistics.median(x) for x in (hand, hand_bg, ours))
            print(f"SQLite acquire+release, {args.rounds} rounds x {args.n} cycles (median):")
            print(f"  hand-written sqlite3 lease cycle           {h * 1e6:8.1f} µs   1.00x")
            print(f"  the same on tenure's file settings         {b * 1e6:8.1f} µs   {b / h:.2f}x")
            print(
                f"  tenure acquire + release                   {t * 1e6:8.1f} µs   {t / h:.2f}x"
                f"   ({t / b:.2f}x the same statements on tenure's file settings)"
            )

    asyncio.run(run())


if __name__ == "__main__":
    main()
