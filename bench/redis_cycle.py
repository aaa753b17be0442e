"""Redis: uncontended acquire+release against two PINGs and against peer libraries.

Starts its own redis-server (no persistence) on a free loopback port unless
``--url`` is given. Every contender runs on the same server in interleaved
rounds; each is reported against the two-PING floor of its own kind of client
(asyncio for tenure and redis-py's asyncio Lock, blocking for
python-redis-lock and pottery, which have no asyncio API). Two pre-encoded
PINGs on a pinned asyncio connection show the wire floor under redis-py's
general command path: tenure sends its scripts that way.

    python bench/redis_cycle.py [--n 2000] [--rounds 7] [--url redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import redis
import redis.asyncio as aioredis

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


async def time_async(fn: Callable[[], Awaitable[object]], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n


def time_sync(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


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
        ping = b"*1\r\n$4\r\nPING\r\n"

        async def two_raw_pings() -> None:
            # The wire floor: what tenure's own pinned connection does, minus the script.
            for _ in range(2):
                await pinned.send_packed_command(ping, check_health=False)
                await pinned.read_response()

        async def tenure_cycle() -> None:
            lock = await locks.acquire("bench:tenure")
            assert lock is not None
            await lock.release()

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        asyncio.run(run(args.url, args.n, args.rounds))
    else:
        with redis_server() as url:
            asyncio.run(run(url, args.n, args.rounds))


if __name__ == "__main__":
    main()
