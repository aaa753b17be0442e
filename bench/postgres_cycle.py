"""PostgreSQL: uncontended acquire+release against its floors and against advisory locks.

Starts its own throwaway PostgreSQL cluster (the tests' helper: ``fsync=off``,
``synchronous_commit=on``) unless ``--url`` is given. In interleaved rounds on
one server, each contender on its own psycopg asyncio connection (autocommit,
statements prepared):

* two ``SELECT 1``: the round-trip floor;
* a hand-written lease cycle: one upsert that takes a free or expired row, one
  compare-and-delete, on a table of its own, at the same durability;
* ``pg_try_advisory_lock`` + ``pg_advisory_unlock`` (session state: not usable
  through a transaction pooler, and no TTL);
* tenure's acquire+release (a pool, fencing, renewer registration, NOTIFY).

    python bench/postgres_cycle.py [--n 2000] [--rounds 7] [--url postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import psycopg

from rounds import interleaved, report
from tenure import LockService

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import PostgresServer

HAND_TABLE = """
CREATE TABLE IF NOT EXISTS bench_hand_lease (
    name text PRIMARY KEY, token text, expires timestamptz NOT NULL
)
"""
HAND_ACQUIRE = """
INSERT INTO bench_hand_lease AS l (name, token, expires)
VALUES (%s, %s, clock_timestamp() + interval '30 seconds')
ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires = excluded.expires
WHERE l.token IS NULL OR l.expires <= clock_timestamp()
RETURNING 1
"""
HAND_RELEASE = "UPDATE bench_hand_lease SET token = NULL WHERE name = %s AND token = %s"


async def run(url: str, n: int, rounds: int) -> None:
    async def connect() -> psycopg.AsyncConnection[tuple[object, ...]]:
        return await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=0)

    floor_conn, hand_conn, advisory_conn = await connect(), await connect(), await connect()
    await hand_conn.execute(HAND_TABLE)
    async with LockService.from_url(url) as locks:

        async def two_selects() -> None:
            await floor_conn.execute("SELECT 1")
            await floor_conn.execute("SELECT 1")

        async def hand_cycle() -> None:
            token = "t" * 32
            cur = await hand_conn.execute(HAND_ACQUIRE, ("bench:hand", token))
            assert await cur.fetchone() is not None
            await hand_conn.execute(HAND_RELEASE, ("bench:hand", token))

        async def advisory() -> None:
            cur = await advisory_conn.execute("SELECT pg_try_advisory_lock(42)")
            assert (await cur.fetchone()) == (True,)
            await advisory_conn.execute("SELECT pg_advisory_unlock(42)")

        async def tenure_cycle() -> None:
            lock = await locks.acquire("bench:tenure")
            assert lock is not None
            await lock.release()

        contenders = {
            "two SELECT 1": two_selects,
            "hand-written lease cycle": hand_cycle,
            "pg_try_advisory_lock+unlock": advisory,
            "tenure acquire+release": tenure_cycle,
        }
        medians = await interleaved(contenders, n, rounds)
    for conn in (floor_conn, hand_conn, advisory_conn):
        await conn.close()
    report(
        f"PostgreSQL uncontended acquire+release, {rounds} rounds x {n} (median):",
        medians,
        {"two SELECT 1": "two SELECT 1", "the hand-written cycle": "hand-written lease cycle"},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        asyncio.run(run(args.url, args.n, args.rounds))
        return
    server = PostgresServer()
    try:
        asyncio.run(run(server.url(), args.n, args.rounds))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
