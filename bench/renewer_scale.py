"""The renewer at scale: 10,000 locks held by one service on SQLite.

Reports the store round trips the renewer made per renewal interval (TTL/3)
and the renewer thread's CPU time as a share of one core, over a window of
several intervals after every lock was acquired.

    python bench/renewer_scale.py [--locks 10000] [--ttl 30] [--intervals 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time

from tenure import LockService


def renewer_cpu_seconds() -> float:
    [thread] = [t for t in threading.enumerate() if t.name == "tenure-renewer"]
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


async def run(n: int, ttl: float, intervals: int) -> None:
    directory = tempfile.mkdtemp(prefix="tenure-bench-")
    async with LockService.from_url(f"sqlite://{directory}/scale.db") as locks:
        start = time.monotonic()
        # Spread the acquisitions over one interval, as a real service would:
        # the hardest case for batching, since every lock falls due at its own time.
        interval = ttl / 3
        held = []
        for i in range(n):
            lock = await locks.acquire(f"scale-{i}", ttl=ttl)
            assert lock is not None
            held.append(lock)
            target = start + interval * (i + 1) / n
            delay = target - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        trips0, cpu0, t0 = locks.renewer.round_trips, renewer_cpu_seconds(), time.monotonic()
        await asyncio.sleep(interval * intervals)
        trips = locks.renewer.round_trips - trips0
        cpu = renewer_cpu_seconds() - cpu0
        wall = time.monotonic() - t0
        lost = sum(not lock.held for lock in held)
        print(f"renewer: {n} locks, TTL {ttl:g} s, over {wall:.1f} s ({intervals} intervals)")
        print(f"  store round trips per renewal interval   {trips / intervals:6.1f}")
        print(f"  renewer CPU, share of one core           {100 * cpu / wall:6.2f} %")
        print(f"  locks lost                               {lost:6d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--intervals", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args.locks, args.ttl, args.intervals))


if __name__ == "__main__":
    main()
