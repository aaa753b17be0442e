"""Semaphores and leader election: the permit cycle against the lock's, and failover.

Starts its own throwaway servers (the tests' helpers: Redis without
persistence; PostgreSQL with ``fsync=off`` by default, ``--fsync`` for a
durable one) and a SQLite file. Two measurements:

* **Cycle.** Uncontended acquire+release of a semaphore permit (limit 4)
  against a lock's acquire+release, on each store (SQLite, Redis, PostgreSQL,
  a three-member etcd cluster), in interleaved rounds of
  one run; on Redis also against a hand-written sorted-set semaphore (one
  ``EVAL`` that drops expired members, counts and adds; one ``ZREM``), the
  usual recipe, since pottery has no semaphore.
* **Herd.** ``--waiters`` callers at once on a semaphore of 4, each holding
  its permit 5 ms: the time each wave of permits costs beyond that work,
  against the same with 8 callers, measured side by side. A release should
  cost one acquire, not one per waiter: the ratio stays near 1x.
* **Failover.** A leader in another process is SIGKILLed; how long until a
  campaigner waiting here is elected, against the target of TTL + 1 s.

    python bench/semaphores.py [--n 1000] [--rounds 5] [--waiters 200] [--failovers 5] [--fsync]
                               [--store sqlite|redis|postgres|etcd ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

from tenure import LockService, Semaphore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import EtcdCluster, PostgresServer, RedisServer

ZSET_ACQUIRE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[3]), ARGV[1])
  return 1
end
return 0
"""

LEADER = textwrap.dedent(
    """
    import asyncio, sys
    from tenure import LockService

    async def main():
        async with LockService.from_url(sys.argv[1]) as locks:
            term = await locks.election("bench-leader").campaign(ttl=float(sys.argv[2]))
            print("elected", flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


HERD_LIMIT = 4


async def _timed(fn: Callable[[], Awaitable[object]], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n


async def cycle(label: str, url: str, n: int, rounds: int, redis_url: str | None) -> None:
    async with LockService.from_url(url) as locks:
        semaphore = locks.semaphore("bench-sem", 4)

        async def lock_cycle() -> None:
            lock = await locks.acquire("bench-lock")
            assert lock is not None
            await lock.release()

        async def permit_cycle() -> None:
            permit = await semaphore.acquire()
            assert permit is not None
            await permit.release()

        contenders: dict[str, Callable[[], Awaitable[object]]] = {
            "lock acquire+release": lock_cycle,
            "permit acquire+release": permit_cycle,
        }
        client = None
        if redis_url is not None:
            client = aioredis.from_url(redis_url)
            acquire = client.register_script(ZSET_ACQUIRE)

            async def zset_cycle() -> None:
                token = os.urandom(16).hex()
                assert await acquire(keys=["bench-zset"], args=[token, 4, 30000]) == 1
                await client.zrem("bench-zset", token)

            contenders["hand-written ZSET semaphore"] = zset_cycle
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for fn in contenders.values():
            await _timed(fn, max(1, n // 10))  # warm up
        for _ in range(rounds):
            for name, fn in contenders.items():
                times[name].append(await _timed(fn, n))
        if client is not None:
            await client.aclose()
    med = {name: statistics.median(values) for name, values in times.items()}
    base = med["lock acquire+release"]
    print(f"{label}: uncontended cycle, {rounds} rounds x {n} (median)")
    for name, value in med.items():
        print(f"  {name:30s} {value * 1e6:8.1f} µs   {value / base:5.2f}x the lock's cycle")


async def _crowd(semaphore: Semaphore, callers: int, hold: float) -> float:
    """Seconds of overhead per wave of permits: ``callers`` at once, each
    holding a permit ``hold`` seconds."""

    async def one() -> None:
        permit = await semaphore.acquire(ttl=30, wait=300)
        assert permit is not None
        await asyncio.sleep(hold)
        await permit.release()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(callers)))
    waves = callers / HERD_LIMIT
    return (time.perf_counter() - start) / waves - hold


async def herd(label: str, url: str, waiters: int) -> None:
    hold = 0.005
    async with LockService.from_url(url) as locks:
        semaphore = locks.semaphore("bench-herd", HERD_LIMIT)
        await _crowd(semaphore, 2 * HERD_LIMIT, hold)  # warm up
        few = statistics.median([await _crowd(semaphore, 2 * HERD_LIMIT, hold) for _ in range(3)])
        many = await _crowd(semaphore, waiters, hold)
    print(
        f"{label}: herd, {waiters} callers on a semaphore of {HERD_LIMIT} holding"
        f" {hold * 1000:g} ms each: {many * 1000:.2f} ms per wave beyond the work,"
        f" against {2 * HERD_LIMIT} callers' {few * 1000:.2f} ms: {many / few:.1f}x"
    )


def _elected_elsewhere(url: str, ttl: float) -> subprocess.Popen[str]:
    """A leader in a process of its own, once it is elected."""
    leader = subprocess.Popen(
        [sys.executable, "-c", LEADER, url, str(ttl)], stdout=subprocess.PIPE, text=True
    )
    assert leader.stdout is not None
    assert leader.stdout.readline().strip() == "elected"
    return leader


async def failover(label: str, url: str, ttl: float, count: int) -> None:
    took: list[float] = []
    async with LockService.from_url(url) as locks:
        election = locks.election("bench-leader")
        for _ in range(count):
            leader = await asyncio.to_thread(_elected_elsewhere, url, ttl)
            standby = asyncio.ensure_future(election.campaign(ttl=ttl, wait=60))
            await asyncio.sleep(0.3)
            killed = time.monotonic()
            os.kill(leader.pid, signal.SIGKILL)
            await asyncio.to_thread(leader.wait)
            term = await standby
            assert term is not None
            took.append(time.monotonic() - killed)
            await term.resign()
    took.sort()
    print(
        f"{label}: leader SIGKILLed, standby elected after (TTL {ttl:g} s, {count} times): "
        f"min {took[0]:.2f} s, median {statistics.median(took):.2f} s, max {took[-1]:.2f} s "
        f"(target: within TTL + 1 s = {ttl + 1:g} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--waiters", type=int, default=200, help="the herd's callers")
    parser.add_argument("--failovers", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--fsync", action="store_true", help="PostgreSQL with fsync=on")
    parser.add_argument(
        "--store",
        action="append",
        choices=["sqlite", "redis", "postgres", "etcd"],
        help="measure only this store (repeatable; all by default)",
    )
    args = parser.parse_args()
    wanted = set(args.store or ["sqlite", "redis", "postgres", "etcd"])
    servers: list[RedisServer | PostgresServer | EtcdCluster] = []
    stores: dict[str, str] = {}
    try:
        if "sqlite" in wanted:
            stores["SQLite"] = f"sqlite:///{tempfile.mkdtemp()}/bench.db"
        if "redis" in wanted:
            redis_server = RedisServer()
            servers.append(redis_server)
            stores["Redis"] = redis_server.url
        if "postgres" in wanted:
            postgres = PostgresServer(fsync=args.fsync)
            servers.append(postgres)
            stores[f"PostgreSQL (fsync={'on' if args.fsync else 'off'})"] = postgres.url()
        if "etcd" in wanted:
            etcd = EtcdCluster()
            servers.append(etcd)
            stores["etcd (three members, --unsafe-no-fsync)"] = etcd.url
        for label, url in stores.items():
            redis_url = url if label == "Redis" else None
            asyncio.run(cycle(label, url, args.n, args.rounds, redis_url))
        for label, url in stores.items():
            asyncio.run(herd(label, url, args.waiters))
        if args.failovers > 0:
            for label, url in stores.items():
                asyncio.run(failover(label, url, args.ttl, args.failovers))
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
