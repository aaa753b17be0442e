"""Release-to-waiter handoff latency between two processes, on any store.

One process holds a lock; another waits for it with ``wait=``. The holder
notes ``time.monotonic_ns()`` (one clock for every process of a Linux host)
just before it releases; the waiter notes it just after its acquire returns.
The difference is the handoff: the release, the datagram that wakes the
waiter, and the waiter's acquire.

    python bench/handoff.py [--n 200] [--url URL]     (default: a temporary SQLite file)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import tempfile
import time
from multiprocessing.connection import Connection

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
    args = parser.parse_args()
    url = args.url or f"sqlite://{tempfile.mkdtemp(prefix='tenure-bench-')}/handoff.db"
    ours, theirs = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=waiter, args=(url, args.n, theirs))
    proc.start()
    assert ours.recv() == "ready"
    latencies = asyncio.run(holder(url, args.n, ours))
    proc.join()
    latencies.sort()

    def p(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    print(f"handoff to a waiting process on {url.split(':')[0]}, {args.n} handoffs:")
    print(
        f"  median {statistics.median(latencies):.2f} ms   p90 {p(0.9):.2f} ms   "
        f"p99 {p(0.99):.2f} ms   max {latencies[-1]:.2f} ms"
    )


if __name__ == "__main__":
    main()
