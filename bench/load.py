"""Load: burst throughput at 1-500 concurrent callers, and the cost of a handoff in a herd.

    python bench/load.py                      every store: SQLite, Redis, PostgreSQL, etcd, MySQL
    python bench/load.py --stores redis,postgres
    python bench/load.py --fsync              PostgreSQL with fsync=on, etcd without
                                              --unsafe-no-fsync, MariaDB with
                                              innodb_flush_log_at_trx_commit=1 (production's)
    python bench/load.py --smoke              a few iterations of everything (the test suite)
    python bench/load.py --parts herd         only some of burst, herd, scheduler
    python bench/load.py --instances 1        the scheduler on one instance (3 by default)
    python bench/load.py --chart docs/img/scheduler-lateness.svg   and its lateness, drawn

Each store is a throwaway server started here (PostgreSQL with ``fsync=off``,
etcd with ``--unsafe-no-fsync`` and MariaDB with
``innodb_flush_log_at_trx_commit=2``, as the tests run them, unless
``--fsync``). Figures are measured side by side in one run and printed as
ratios:

* **burst**: acquire+release cycles per second with 1, 10, 100 and 500
  callers at once in one process (each on names of its own), and how many
  calls failed. Beside it, the peer a user would otherwise pick, on the same
  server and concurrency: redis-py's asyncio ``Lock`` (over a blocking pool of
  the same size as tenure's ``pool_max``) on Redis, a hand-written
  single-statement lease cycle (psycopg pool of the same size) on PostgreSQL.
* **herd**: N waiters (``wait=60``) for one name in one process, each holding
  it 1 ms: the time per handoff, against one waiter's handoff measured the
  same way in the same run (the target is at most 2x).
* **scheduler**: 1,000 every-second tasks on 3 instances (processes,
  ``bench/scheduler_instance.py``) for 15 s: occurrences missing or run
  twice (all of them), lateness p50/p99 (the task's first line minus its fire
  time, on the host that ran it) of the last 10 s, and the p99 of the first
  5 s on its own (the warm-up: connections, caches, instances learning of
  each other), CPU per instance (share of one core, all 15 s) and store calls
  per instance per tick. Beside it, once per run: APScheduler 3 running the same
  jobs in one process (not cluster-safe), measured the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mysql_server import MariaDBServer
from tests.servers import EtcdCluster, PostgresServer, RedisServer

from tenure import LockService, StoreUnavailable

Cycle = Callable[[str], Awaitable[None]]


async def burst(cycle: Cycle, callers: int, per_caller: int) -> tuple[float, int]:
    """Cycles per second with ``callers`` at once, and how many calls failed."""
    failed = 0
    prefix = uuid.uuid4().hex[:8]

    async def caller(k: int) -> None:
        nonlocal failed
        for j in range(per_caller):
            try:
                await cycle(f"{prefix}-{k}-{j}")
            except Exception:
                failed += 1

    started = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(callers)))
    took = time.perf_counter() - started
    return callers * per_caller / took, failed


async def tenure_cycle(locks: LockService) -> Cycle:
    async def cycle(name: str) -> None:
        lock = await locks.acquire(name, ttl=30)
        if lock is None:
            raise RuntimeError(f"{name} was not granted")
        await lock.release()

    return cycle


async def herd(locks: LockService, waiters: int) -> float:
    """Seconds per handoff among ``waiters`` waiting for one name, each holding it 1 ms."""
    name = f"herd-{uuid.uuid4().hex[:8]}"
    first = await locks.acquire(name, ttl=30)
    assert first is not None
    done = 0

    async def waiter() -> None:
        nonlocal done
        lock = await locks.acquire(name, ttl=30, wait=120)
        assert lock is not None, "a waiter timed out"
        await asyncio.sleep(0.001)
        await lock.release()
        done += 1

    tasks = [asyncio.ensure_future(waiter()) for _ in range(waiters)]
    await asyncio.sleep(0.5 + waiters / 500)  # every waiter is waiting
    started = time.perf_counter()
    await first.release()
    await asyncio.gather(*tasks)
    took = time.perf_counter() - started
    assert done == waiters
    return took / waiters


def redis_peer(url: str, pool_max: int) -> tuple[Callable[[], Awaitable[Cycle]], Any]:
    import redis.asyncio as aioredis

    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=pool_max, timeout=20)
    client = aioredis.Redis(connection_pool=pool)

    async def make() -> Cycle:
        async def cycle(name: str) -> None:
            lock = client.lock(f"peer:{name}", timeout=30, blocking=False)
            if not await lock.acquire():
                raise RuntimeError(f"{name} was not granted")
            await lock.release()

        return cycle

    return make, client.aclose


def postgres_peer(url: str, pool_max: int) -> tuple[Callable[[], Awaitable[Cycle]], Any]:
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(
        url, min_size=pool_max, max_size=pool_max, open=False, kwargs={"autocommit": True}
    )

    async def make() -> Cycle:
        await pool.open(wait=True)
        async with pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS bench_leases (name text PRIMARY KEY, token text,"
                " expires timestamptz)"
            )

        async def cycle(name: str) -> None:
            token = uuid.uuid4().hex
            async with pool.connection() as conn:
                got = await conn.execute(
                    "INSERT INTO bench_leases VALUES (%s, %s, clock_timestamp() + interval '30 s')"
                    " ON CONFLICT (name) DO UPDATE SET token = excluded.token,"
                    " expires = excluded.expires WHERE bench_leases.expires < clock_timestamp()"
                    " RETURNING 1",
                    (name, token),
                )
                if await got.fetchone() is None:
                    raise RuntimeError(f"{name} was not granted")
            async with pool.connection() as conn:
                await conn.execute(
                    "DELETE FROM bench_leases WHERE name = %s AND token = %s", (name, token)
                )

        return cycle

    return make, pool.close


INSTANCE = Path(__file__).resolve().parent / "scheduler_instance.py"
SCHEDULER = (1000, 10.0, 5.0)
"""Tasks, seconds measured, and seconds of warm-up before them."""
SCHEDULER_SMOKE = (20, 3.0, 1.0)


async def scheduler_load(
    url: str,
    tasks: int,
    seconds: float,
    instances: int,
    *,
    warmup: float,
    apscheduler: bool = False,
) -> tuple[str, list[float]]:
    """Run the instances side by side; one line of figures, and the steady
    state's lateness of every run, in ms (for ``--chart``).

    They serve ``warmup + seconds``: every occurrence of both counts for
    missing and doubled, the lateness of the last ``seconds`` is the steady
    state's, and the first ``warmup`` seconds' (connections opened, code and
    caches warmed, instances learning of each other) is given on its own."""
    start = time.time() + 3.0 + tasks / 1000  # imports, connections and registration first
    extra = ["apscheduler"] if apscheduler else []
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(INSTANCE),
            url,
            str(tasks),
            repr(start),
            repr(warmup + seconds),
            *extra,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(instances)
    ]
    results = []
    for proc in procs:
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a scheduler instance failed on {url}")
        results.append(json.loads(out))
    runs: collections.Counter[tuple[float, int]] = collections.Counter()
    for result in results:
        for fire, indices in result["ran"].items():
            runs.update((float(fire), i) for i in indices)
    due = range(math.ceil(start) + 1, int(start + warmup + seconds) - 1)
    missing = sum(runs[(float(t), i)] == 0 for t in due for i in range(tasks))
    doubled = sum(n > 1 for n in runs.values())
    steady_from = start + warmup
    late = sorted(x for r in results for fire, x in r["late"] if fire >= steady_from) or [math.nan]
    early = sorted(x for r in results for fire, x in r["late"] if fire < steady_from) or [math.nan]
    cpu = max(result["cpu"] / result["wall"] for result in results)
    line = (
        f"{len(due) * tasks} occurrences: missing {missing}, doubled {doubled}; "
        f"lateness p50 {late[len(late) // 2] * 1000:.0f} ms, "
        f"p99 {late[int(len(late) * 0.99)] * 1000:.0f} ms "
        f"(first {warmup:g} s: p99 {early[int(len(early) * 0.99)] * 1000:.0f} ms); "
        f"CPU {cpu:.3f} core (busiest instance)"
    )
    if not apscheduler:
        calls = max(sum(r["store_calls"].values()) / max(r["ticks"], 1) for r in results)
        line += f"; {calls:.1f} store calls per tick (busiest instance)"
    return line, [x * 1000 for x in late if not math.isnan(x)]


def servers(names: list[str], fsync: bool, stack: ExitStack) -> dict[str, str]:
    urls: dict[str, str] = {}
    for name in names:
        if name == "sqlite":
            urls[name] = f"sqlite://{stack.enter_context(tempfile.TemporaryDirectory())}/b.db"
        elif name == "redis":
            redis = RedisServer()
            stack.callback(redis.stop)
            urls[name] = redis.url
        elif name == "postgres":
            postgres = PostgresServer(fsync=fsync)
            stack.callback(postgres.stop)
            urls[name] = postgres.url()
        elif name == "etcd":
            etcd = EtcdCluster(fsync=fsync)
            stack.callback(etcd.stop)
            urls[name] = etcd.url
        elif name == "mysql":
            mysql = MariaDBServer(durable=fsync)
            stack.callback(mysql.stop)
            urls[name] = mysql.url()
        else:
            raise SystemExit(f"unknown store {name!r}; known: sqlite, redis, postgres, etcd, mysql")
    return urls


async def measure(
    name: str, url: str, smoke: bool, fsync: bool, parts: set[str], *, instances: int = 3
) -> list[float]:
    """Measure ``parts`` on one store, printing the figures; the scheduler's
    steady-state lateness in ms (empty without that part)."""
    levels = (1, 10) if smoke else (1, 10, 100, 500)
    total = 40 if smoke else 4000
    herd_size = 10 if smoke else 500
    setting = {
        "postgres": f" (fsync={'on' if fsync else 'off'})",
        "etcd": "" if fsync else " (--unsafe-no-fsync)",
        "mysql": f" (innodb_flush_log_at_trx_commit={1 if fsync else 2})",
    }.get(name, "")
    print(f"\n## {name}{setting}")
    async with LockService.from_url(url) as locks:
        if "burst" in parts:
            ours = await tenure_cycle(locks)
            peer_make: Callable[[], Awaitable[Cycle]] | None = None
            peer_close: Any = None
            pool_max = getattr(locks.store, "pool_max", 10)
            if name == "redis":
                peer_make, peer_close = redis_peer(url, pool_max)
                peer_label = "redis-py Lock"
            elif name == "postgres":
                peer_make, peer_close = postgres_peer(url, pool_max)
                peer_label = "hand-written lease"
            peer = await peer_make() if peer_make is not None else None
            print(
                "burst: callers | tenure cycles/s (failed) | "
                + (f"{peer_label} | ratio" if peer else "")
            )
            for callers in levels:
                per_caller = max(1, total // callers)
                rate, failed = await burst(ours, callers, per_caller)
                line = f"  {callers:>4} | {rate:>9.0f} ({failed})"
                if peer is not None:
                    peer_rate, peer_failed = await burst(peer, callers, per_caller)
                    line += f" | {peer_rate:>9.0f} ({peer_failed}) | {rate / peer_rate:.2f}x"
                print(line)
            if peer_close is not None:
                await peer_close()
        if "herd" in parts:
            single = statistics.median([await herd(locks, 1) for _ in range(5 if smoke else 30)])
            try:
                many = await herd(locks, herd_size)
            except StoreUnavailable as exc:  # reported as a result: a herd that fails is a finding
                print(
                    f"herd: {herd_size} waiters FAILED (one waiter {single * 1000:.2f} ms): {exc}"
                )
            else:
                print(
                    f"herd: {herd_size} waiters {many * 1000:.2f} ms per handoff, one waiter "
                    f"{single * 1000:.2f} ms: {many / single:.1f}x (target 2x)"
                )
    if "scheduler" in parts:
        tasks, seconds, warmup = SCHEDULER_SMOKE if smoke else SCHEDULER
        result, late = await scheduler_load(url, tasks, seconds, instances, warmup=warmup)
        print(f"scheduler: {tasks} tasks x {instances} instance(s): {result}")
        return late
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="sqlite,redis,postgres,etcd,mysql")
    parser.add_argument("--fsync", action="store_true", help="PostgreSQL with fsync=on")
    parser.add_argument("--smoke", action="store_true", help="a few iterations of everything")
    parser.add_argument(
        "--parts", default="burst,herd,scheduler", help="which of burst, herd, scheduler to run"
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=3,
        help="scheduler instances (processes) per store; 1 compares like for like with APScheduler",
    )
    parser.add_argument(
        "--chart", type=Path, metavar="SVG", help="draw the scheduler's lateness as a histogram"
    )
    args = parser.parse_args()
    if args.instances < 1:
        parser.error(f"--instances must be at least 1, got {args.instances}")
    parts = set(args.parts.split(","))
    if not parts <= {"burst", "herd", "scheduler"}:
        parser.error(f"--parts takes burst, herd and scheduler, got {args.parts!r}")
    if args.chart is not None and "scheduler" not in parts:
        parser.error("--chart draws the scheduler's lateness: include scheduler in --parts")
    tasks, seconds, warmup = SCHEDULER_SMOKE if args.smoke else SCHEDULER
    aps_late: list[float] = []
    if "scheduler" in parts:
        print("\n## APScheduler 3 (one process, not cluster-safe)")
        aps, aps_late = asyncio.run(
            scheduler_load("", tasks, seconds, 1, warmup=warmup, apscheduler=True)
        )
        print(f"scheduler: {tasks} tasks x 1 instance: {aps}")
    lateness: dict[str, list[float]] = {}
    with ExitStack() as stack:
        urls = servers(args.stores.split(","), args.fsync, stack)
        for name, url in urls.items():
            lateness[f"tenure, {name}, {args.instances} instances"] = asyncio.run(
                measure(name, url, args.smoke, args.fsync, parts, instances=args.instances)
            )
    if args.chart is not None:
        from charts import histograms

        lateness["APScheduler 3, one process"] = aps_late
        histograms(
            args.chart,
            f"Scheduler lateness: {tasks:,} every-second tasks",
            "ms",
            lateness,
            note="lateness = the task's first line minus its fire time; bench/load.py",
        )
        print(f"\nchart: {args.chart}")


if __name__ == "__main__":
    main()
