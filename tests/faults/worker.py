"""A fault-suite worker: acquire, read-modify-write the fenced resource, release; log it all.

    python -m tests.faults.worker URL NAME LOG RESOURCE_PORT ITERATIONS TTL HOLD [TASKS]

Each event is one JSON line appended to LOG and flushed at once (see
history.py), so a worker killed mid-run leaves everything up to its death.

TASKS > 1 runs that many workers as tasks of this one process, sharing one
LockService, each logging to ``LOG`` with ``-1``, ``-2`` ... before its
suffix: the only way to contend on the memory store, which lives in one process.

``TENURE_FAULT_KIND`` says what it takes: ``lock`` (the default), ``semaphore:N``
(a permit of a semaphore of limit N; no fenced resource then, as N holders
may write at once) or ``election`` (a term, campaigning; released by
resigning).

With ``TENURE_FAULT_WALL_STEP=SECONDS`` in its environment, the worker steps
its process's wall clock (``time.time`` and ``time.time_ns``: the wall clock
of all Python code, tenure's and its drivers') by that much right after its first
grant, and logs a ``wallstep`` event with the wall time before and after.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tenure import Lock, LockService, StoreUnavailable


class Log:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole run

    def __call__(self, **event: Any) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()


def deadline_ns(lock: Lock) -> int:
    return int(lock.held_until * 1e9)  # time.monotonic() seconds, the clock of monotonic_ns


async def watch(lock: Lock, log: Log) -> None:
    """While held, log what ``held`` says and the deadline every 50 ms: the renewals
    show in the log, so a worker killed mid-hold leaves its lease's end within 50 ms."""
    while True:
        log(op="check", t=time.monotonic_ns(), held=lock.held, deadline=deadline_ns(lock))
        await asyncio.sleep(0.05)


def step_the_wall_clock(seconds: float, log: Log) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    before = real_time()
    time.time = lambda: real_time() + seconds
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)
    log(op="wallstep", t=time.monotonic_ns(), before=before, after=time.time())


async def main(argv: list[str]) -> None:
    url, name, log_path = argv[:3]
    tasks = int(argv[7]) if len(argv) > 7 else 1
    async with LockService.from_url(url) as locks:
        if tasks == 1:
            await work(locks, name, Log(log_path), argv)
        else:
            path = Path(log_path)
            logs = [Log(str(path.with_stem(f"{path.stem}-{i}"))) for i in range(1, tasks + 1)]
            await asyncio.gather(*(work(locks, name, log, argv) for log in logs))


async def take(locks: LockService, name: str, ttl: float) -> Lock | None:
    """A lock, a permit or a term, as ``TENURE_FAULT_KIND`` says."""
    kind = os.environ.get("TENURE_FAULT_KIND", "lock")
    if kind.startswith("semaphore:"):
        return await locks.semaphore(name, int(kind.split(":")[1])).acquire(ttl=ttl, wait=30)
    if kind == "election":
        term = await locks.election(name).campaign(ttl=ttl, wait=30)
        return None if term is None else term.lock
    return await locks.acquire(name, ttl=ttl, wait=30)


async def work(locks: LockService, name: str, log: Log, argv: list[str]) -> None:
    port, n, ttl, hold = int(argv[3]), int(argv[4]), float(argv[5]), float(argv[6])
    fenced = not os.environ.get("TENURE_FAULT_KIND", "lock").startswith("semaphore:")
    wall_step = float(os.environ.get("TENURE_FAULT_WALL_STEP", "0"))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def ask(line: str) -> list[str]:
        writer.write((line + "\n").encode())
        await writer.drain()
        return (await reader.readline()).decode().split()

    log(op="ready", t=time.monotonic_ns())
    for _ in range(n):
        t0 = time.monotonic_ns()
        while True:
            try:
                lock = await take(locks, name, ttl)
                break
            except StoreUnavailable:  # fail closed: an application retries
                log(op="unavailable", t=time.monotonic_ns())
                await asyncio.sleep(0.05)
        t1 = time.monotonic_ns()
        if lock is None:
            log(op="acquire", t0=t0, t1=t1, fence=None, deadline=None)
            continue
        log(op="acquire", t0=t0, t1=t1, fence=lock.fencing_token, deadline=deadline_ns(lock))
        if wall_step:
            step_the_wall_clock(wall_step, log)
            wall_step = 0
        watching = asyncio.ensure_future(watch(lock, log))
        answer = await ask(f"read {lock.fencing_token}") if fenced else ["unfenced"]
        await asyncio.sleep(hold)  # the window in which a pause or a kill lands
        log(op="check", t=time.monotonic_ns(), held=lock.held, deadline=deadline_ns(lock))
        w0 = time.monotonic_ns()
        accepted = False
        if answer[0] == "ok":
            accepted = (await ask(f"write {lock.fencing_token} {int(answer[1]) + 1}"))[0] == "ok"
        log(
            op="write",
            t0=w0,
            t1=time.monotonic_ns(),
            fence=lock.fencing_token,
            accepted=accepted,
        )
        watching.cancel()
        deadline = deadline_ns(lock)
        r0 = time.monotonic_ns()
        try:
            ok: bool | None = await lock.release()
        except StoreUnavailable:  # unknown whether it arrived; the holder stopped at r0
            ok = None
        log(op="release", t0=r0, t1=time.monotonic_ns(), ok=ok, deadline=deadline)
    writer.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:9]))
