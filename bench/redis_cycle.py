"""Redis: uncontended acquire+release against two PINGs and against peer libraries.

Starts its own redis-server (no persistence) on a free loopback port unless
``--url`` is given. Every contender runs on the same server in interleaved
rounds; each is reported against the two-PING floor of its own kind of client
(asyncio for tenure and redis-py's asyncio Lock, blocking for
python-redis-lock and pottery, which have no asyncio API). Two pre-encoded
PINGs on a pinned asyncio connection show the wire floor under redis-py's
general command path: tenure sends its scripts that way.

    python bench/redis_cycle.py [--n 2000] [--rounds 7] [--url redis://...]
    python bench/redis_cycle.py --cluster     (a throwaway cluster of three masters)

With ``--cluster``: tenure and redis-py's asyncio ``Lock`` through the cluster
client, against two PINGs sent by that client to the node that serves the
lock's slot, and two pre-encoded PINGs on a connection pinned to that node.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from rounds import time_async, time_sync
from tenure import LockService


@contextmanager
def redis_server() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            tempfile.mkdtemp(),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait()


def raw_pings(conn: Any) -> Callable[[], Awaitable[None]]:
    """Two pre-encoded PINGs on ``conn``: the wire floor, what tenure's own
    pinned connections do minus the script."""
    ping = b"*1\r\n$4\r\nPING\r\n"

    async def two() -> None:
        for _ in range(2):
            await conn.send_packed_command(ping, check_health=False)
            await conn.read_response()

    return two


def cycle(locks: LockService, name: str) -> Callable[[], Awaitable[None]]:
    """One uncontended tenure acquire+release of ``name``."""

    async def one() -> None:
        lock = await locks.acquire(name)
        assert lock is not None
        await lock.release()

    return one


async def run(url: str, n: int, rounds: int) -> None:
    import pottery
    import redis_lock

    aclient = aioredis.from_url(url)
    sclient = redis.Redis.from_url(url)
    results: dict[str, list[float]] = {}
    async with LockService.from_url(url) as locks:

        async def two_pings_async() -> None:
            await aclient.ping()
            await aclient.ping()

        pinned = await aclient.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        two_raw_pings = raw_pings(pinned)
        tenure_cycle = cycle(locks, "bench:tenure")

        async def redis_py_lock() -> None:
            lock = aclient.lock("bench:redis-py", timeout=30)
            assert await lock.acquire(blocking=False)
            await lock.release()

        def two_pings_sync() -> None:
            sclient.ping()
            sclient.ping()

        def python_redis_lock() -> None:
            lock = redis_lock.Lock(sclient, "bench:python-redis-lock", expire=30)
            assert lock.acquire(blocking=False)
            lock.release()

        def pottery_redlock() -> None:
            lock = pottery.Redlock(key="bench:pottery", masters={sclient}, auto_release_time=30)
            assert lock.acquire(blocking=False)
            lock.release()

        contenders_async = {
            "two PINGs (asyncio)": two_pings_async,
            "two PINGs, pre-encoded, pinned": two_raw_pings,
            "tenure acquire+release": tenure_cycle,
            "redis-py asyncio Lock": redis_py_lock,
        }
        contenders_sync = {
            "two PINGs (blocking)": two_pings_sync,
            "python-redis-lock": python_redis_lock,
            "pottery Redlock": pottery_redlock,
        }
        for _ in range(rounds):
            for name, afn in contenders_async.items():
                results.setdefault(name, []).append(await time_async(afn, n))
            for name, sfn in contenders_sync.items():
                results.setdefault(name, []).append(time_sync(sfn, n))
    await aclient.connection_pool.release(pinned)
    await aclient.aclose()
    sclient.close()
    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"Redis uncontended acquire+release, {rounds} rounds x {n} (median):")
    for name, value in med.items():
        floor = (
            med["two PINGs (asyncio)"] if name in contenders_async else med["two PINGs (blocking)"]
        )
        print(f"  {name:32s} {value * 1e6:8.1f} µs   {value / floor:5.2f}x its floor")


async def run_cluster(url: str, n: int, rounds: int) -> None:
    client = aioredis.RedisCluster.from_url(url.partition("?")[0])  # without tenure's options
    await client.initialize()
    results: dict[str, list[float]] = {}
    async with LockService.from_url(f"{url}&prefix=bench") as locks:
        node = client.get_node_from_key("{bench:tenure}:lease")
        assert node is not None
        pinned = node.acquire_connection()

        async def two_pings() -> None:
            await client.execute_command("PING", target_nodes=node)
            await client.execute_command("PING", target_nodes=node)

        async def redis_py_lock() -> None:
            lock = client.lock("{bench:tenure}:redis-py", timeout=30)
            assert await lock.acquire(blocking=False)
            await lock.release()

        contenders = {
            "two PINGs (cluster client)": two_pings,
            "two PINGs, pre-encoded, pinned": raw_pings(pinned),
            "tenure acquire+release": cycle(locks, "tenure"),
            "redis-py asyncio Lock": redis_py_lock,
        }
        for _ in range(rounds):
            for name, fn in contenders.items():
                results.setdefault(name, []).append(await time_async(fn, n))
        node.release(pinned)
    await client.aclose()
    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"Redis Cluster (3 masters) uncontended acquire+release, {rounds} rounds x {n} (median):")
    for name, value in med.items():
        floor = med["two PINGs (cluster client)"]
        print(f"  {name:32s} {value * 1e6:8.1f} µs   {value / floor:5.2f}x its floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--url")
    parser.add_argument("--cluster", action="store_true", help="a throwaway Redis Cluster")
    args = parser.parse_args()
    if args.cluster:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.servers import RedisClusterServers

        cluster = RedisClusterServers()
        try:
            asyncio.run(run_cluster(cluster.url, args.n, args.rounds))
        finally:
            cluster.stop()
    elif args.url:
        asyncio.run(run(args.url, args.n, args.rounds))
    else:
        with redis_server() as url:
            asyncio.run(run(url, args.n, args.rounds))


if __name__ == "__main__":
    main()
