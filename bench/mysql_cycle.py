"""MySQL/MariaDB: uncontended acquire+release against its floors and against GET_LOCK.

Starts its own throwaway MariaDB server (the tests' helper:
``innodb_flush_log_at_trx_commit=2``; ``--durable`` for 1, production's
setting) unless ``--url`` is given. In interleaved rounds on one server, each
contender on its own aiomysql connection (autocommit):

* two ``SELECT 1``: the round-trip floor;
* a hand-written lease cycle: one upsert that takes a free or expired row, one
  compare-and-set release, on a table of its own, at the same durability
  (without reading a fencing token back: MySQL has no ``RETURNING``);
* the same cycle with fencing, written by hand as tenure's is: the upsert
  also raises a counter per name and returns it as its insert id, and a name
  without a row starts above a floor read (locking) from another table in
  the same statement (what keeps a token from repeating once rows are pruned),
  once with the server's clock in microseconds as the floor instead (tenure's
  choice: no read), and once with no floor at all (tokens that could repeat
  after a prune);
* both of those again on asyncmy (a Cython driver; the ``bench`` extra),
  which is how the store's driver was chosen (docs/stores/mysql.md);
* ``GET_LOCK`` + ``RELEASE_LOCK`` (session state: not usable through a
  transaction pooler, no TTL, no fencing);
* tenure's acquire+release (one ``INSERT ... ON DUPLICATE KEY UPDATE`` whose
  answer carries the fencing token, one compare-and-set ``UPDATE``; renewer
  registration).

    python bench/mysql_cycle.py [--n 2000] [--rounds 7] [--durable] [--url mysql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiomysql

from rounds import interleaved, report
from tenure import LockService

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.mysql_server import MariaDBServer

HAND_TABLE = """
CREATE TABLE IF NOT EXISTS bench_hand_lease (
    name VARBINARY(255) NOT NULL PRIMARY KEY, token VARBINARY(64) NULL,
    expires DATETIME(6) NOT NULL
) ENGINE=InnoDB
"""
# Takes a free or expired row (or inserts it); affected rows say whether it did.
HAND_ACQUIRE = """
INSERT INTO bench_hand_lease (name, token, expires)
VALUES (%s, %s, UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)
ON DUPLICATE KEY UPDATE
  token = IF(token IS NULL OR expires <= UTC_TIMESTAMP(6), VALUES(token), token),
  expires = IF(token = VALUES(token), VALUES(expires), expires)
"""
HAND_RELEASE = "UPDATE bench_hand_lease SET token = NULL WHERE name = %s AND token = %s"

FENCED_TABLES = (
    """CREATE TABLE IF NOT EXISTS bench_fenced_lease (
    name VARBINARY(255) NOT NULL PRIMARY KEY, token VARBINARY(64) NULL,
    fence BIGINT NOT NULL, expires DATETIME(6) NOT NULL
) ENGINE=InnoDB""",
    """CREATE TABLE IF NOT EXISTS bench_fenced_floor (
    id TINYINT NOT NULL PRIMARY KEY, floor BIGINT NOT NULL
) ENGINE=InnoDB""",
    "INSERT INTO bench_fenced_floor VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id",
)
FLOOR = "(SELECT floor FROM bench_fenced_floor WHERE id = 1)"
TIME_FLOOR = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"
# The token comes back as the insert id; affected rows say whether it was taken.
FENCED_ACQUIRE = """
INSERT INTO bench_fenced_lease (name, token, fence, expires)
VALUES (%s, %s, LAST_INSERT_ID({floor} + 1), UTC_TIMESTAMP(6) + INTERVAL 30 SECOND)
ON DUPLICATE KEY UPDATE
  fence = IF(token IS NULL OR expires <= UTC_TIMESTAMP(6), LAST_INSERT_ID(fence + 1), fence),
  token = IF(token IS NULL OR expires <= UTC_TIMESTAMP(6), VALUES(token), token),
  expires = IF(token = VALUES(token), VALUES(expires), expires)
"""
FENCED_RELEASE = "UPDATE bench_fenced_lease SET token = NULL WHERE name = %s AND token = %s"


def two_selects(conn: Any) -> Callable[[], Awaitable[None]]:
    async def two() -> None:
        async with conn.cursor() as cur:
            await cur.execute("SELECT 1")
            await cur.fetchall()
            await cur.execute("SELECT 1")
            await cur.fetchall()

    return two


def hand_cycle(
    conn: Any, name: str, acquire: str = HAND_ACQUIRE, release: str = HAND_RELEASE
) -> Callable[[], Awaitable[None]]:
    async def cycle() -> None:
        token = "t" * 32
        async with conn.cursor() as cur:
            await cur.execute(acquire, (name, token))
            assert cur.rowcount >= 1
            await cur.execute(release, (name, token))

    return cycle


async def run(url: str, n: int, rounds: int) -> None:
    parts = urlsplit(url)

    async def connect(driver: Any = aiomysql) -> Any:
        return await driver.connect(
            host=parts.hostname,
            port=parts.port or 3306,
            user=parts.username,
            password=parts.password or "",
            db=parts.path.lstrip("/"),
            autocommit=True,
        )

    floor_conn, hand_conn, get_lock_conn = await connect(), await connect(), await connect()
    conns = [floor_conn, hand_conn, get_lock_conn]
    fenced_conn, unfloored_conn, timed_conn = await connect(), await connect(), await connect()
    conns += [fenced_conn, unfloored_conn, timed_conn]
    async with hand_conn.cursor() as cur:
        await cur.execute(HAND_TABLE)
        for statement in FENCED_TABLES:
            await cur.execute(statement)
    fenced = FENCED_ACQUIRE.format(floor=FLOOR)
    unfloored = FENCED_ACQUIRE.format(floor="0")
    timed = FENCED_ACQUIRE.format(floor=TIME_FLOOR)
    contenders: dict[str, Callable[[], Awaitable[object]]] = {
        "two SELECT 1": two_selects(floor_conn),
        "hand-written lease cycle": hand_cycle(hand_conn, "bench:hand"),
        "hand-written, fenced": hand_cycle(fenced_conn, "bench:f", fenced, FENCED_RELEASE),
        "fenced, time floor": hand_cycle(timed_conn, "bench:t", timed, FENCED_RELEASE),
        "fenced, no floor": hand_cycle(unfloored_conn, "bench:u", unfloored, FENCED_RELEASE),
    }
    try:
        import asyncmy
    except ImportError:
        print("(asyncmy is not installed: its contenders are left out)")
    else:
        floor_my, hand_my = await connect(asyncmy), await connect(asyncmy)
        conns += [floor_my, hand_my]
        contenders["two SELECT 1 (asyncmy)"] = two_selects(floor_my)
        contenders["hand-written cycle (asyncmy)"] = hand_cycle(hand_my, "bench:hand-asyncmy")
    async with LockService.from_url(url) as locks:

        async def get_lock() -> None:
            async with get_lock_conn.cursor() as cur:
                await cur.execute("SELECT GET_LOCK('bench', 0)")
                assert (await cur.fetchone()) == (1,)
                await cur.execute("SELECT RELEASE_LOCK('bench')")
                await cur.fetchall()

        async def tenure_cycle() -> None:
            lock = await locks.acquire("bench:tenure")
            assert lock is not None
            await lock.release()

        contenders["GET_LOCK+RELEASE_LOCK"] = get_lock
        contenders["tenure acquire+release"] = tenure_cycle
        medians = await interleaved(contenders, n, rounds)
    for conn in conns:
        conn.close()
    report(
        f"MySQL/MariaDB uncontended acquire+release, {rounds} rounds x {n} (median):",
        medians,
        {
            "two SELECT 1": "two SELECT 1",
            "the hand-written cycle": "hand-written lease cycle",
            "the fenced one": "hand-written, fenced",
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--durable", action="store_true", help="innodb_flush_log_at_trx_commit=1")
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        asyncio.run(run(args.url, args.n, args.rounds))
        return
    server = MariaDBServer(durable=args.durable)
    try:
        print(f"innodb_flush_log_at_trx_commit={'1' if args.durable else '2'}")
        asyncio.run(run(server.url(), args.n, args.rounds))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
