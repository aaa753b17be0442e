"""Release-to-waiter handoff latency between two processes, on any store.

One process holds a lock; another waits for it with ``wait=``. The holder
notes ``time.monotonic_ns()`` (one clock for every process of a Linux host)
just before it releases; the waiter notes it just after its acquire returns.
The difference is the handoff: the release, the datagram that wakes the
waiter, and the waiter's acquire.

    python bench/handoff.py [--n 200] [--url URL]     (default: a temporary SQLite file)
    python bench/handoff.py --postgres                 (a throwaway PostgreSQL cluster)
    python bench/handoff.py --etcd                     (a throwaway three-member etcd cluster)

With a Redis URL, python-redis-lock (whose waiters block in BLPOP) is measured
the same way in the same run, for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
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
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--url", help="store URL (default: a temporary SQLite file)")
    parser.add_argument(
        "--postgres", action="store_true", help="start a throwaway PostgreSQL cluster (the tests')"
    )
    parser.add_argument(
        "--etcd", action="store_true", help="start a throwaway etcd cluster (the tests')"
    )
    args = parser.parse_args()
    if args.postgres or args.etcd:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.servers import EtcdCluster, PostgresServer

        server: PostgresServer | EtcdCluster = PostgresServer() if args.postgres else EtcdCluster()
        try:
            measure(server.url() if isinstance(server, PostgresServer) else server.url, args.n)
        finally:
            server.stop()
        return
    measure(args.url or f"sqlite://{tempfile.mkdtemp(prefix='tenure-bench-')}/handoff.db", args.n)


def measure(url: str, n: int) -> None:
    spawn = mp.get_context("spawn")
    ours, theirs = mp.Pipe()
    proc = spawn.Process(target=waiter, args=(url, n, theirs))
    proc.start()
    assert ours.recv() == "ready"
    latencies = asyncio.run(holder(url, n, ours))
    proc.join()
    print(f"handoff to a waiting process on {url.split(':', maxsplit=1)[0]}, {n} handoffs:")
    report("tenure", latencies)
    if url.startswith(("redis://", "rediss://", "unix://")):
        ours, theirs = mp.Pipe()
        proc = spawn.Process(target=peer_waiter, args=(url, n, theirs))
        proc.start()
        assert ours.recv() == "ready"
        peer = peer_holder(url, n, ours)
        proc.join()
        report("python-redis-lock (BLPOP)", peer)


if __name__ == "__main__":
    main()
