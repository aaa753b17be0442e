"""The contract across real OS processes: contention, SIGKILL, SIGSTOP, a slow holder.

Run on every store that several processes can share.
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections.abc import Iterator

import pytest

from tenure import LockService

from ..helpers.procs import Worker

TTL = 1.0


@pytest.fixture
def workers(shared_url: str) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


def spawn(workers: list[Worker], url: str, n: int = 1) -> list[Worker]:
    new = [Worker(url) for _ in range(n)]
    workers.extend(new)
    return new


def test_processes_contending_get_exactly_one_grant(shared_url: str, workers: list[Worker]) -> None:
    procs = spawn(workers, shared_url, 3)
    fences: list[int] = []
    for _ in range(10):
        at = time.monotonic_ns() + 200_000_000  # everyone fires at the same instant
        for proc in procs:
            proc.send(f"acquire race {TTL} 0 {at}")
        answers = [proc.read() for proc in procs]
        winners = [(p, a) for p, a in zip(procs, answers, strict=True) if a["ok"]]
        assert len(winners) == 1, answers
        winner, answer = winners[0]
        fences.append(answer["fence"])
        assert winner.ask("release")["released"] is True
    assert fences == sorted(set(fences))


async def test_sigkill_frees_the_lock_within_the_ttl(
    shared_url: str, workers: list[Worker]
) -> None:
    [holder] = spawn(workers, shared_url)
    got = holder.ask(f"acquire victim {TTL}")
    assert got["ok"]
    async with LockService.from_url(shared_url) as locks:
        assert await locks.acquire("victim", ttl=TTL) is None, "held before the kill"
        holder.signal(signal.SIGKILL)
        holder.proc.wait()
        killed = time.monotonic()
        lock = await locks.acquire("victim", ttl=TTL, wait=TTL + 2)
        freed_after = time.monotonic() - killed
        assert lock is not None
        assert lock.fencing_token > got["fence"]
        # Its last renewal was at most TTL/3 before the kill; a margin for a
        # loaded machine on top of what the store promises: the TTL, or on
        # etcd ceil(TTL) plus up to 0.5 s (its leader looks for expired
        # leases twice a second).
        promised = math.ceil(TTL) + 0.5 if shared_url.startswith("etcd://") else TTL
        assert freed_after <= promised + 0.5, freed_after


async def test_sigstop_past_the_ttl_loses_the_lock_to_another_process(
    shared_url: str, workers: list[Worker]
) -> None:
    [holder] = spawn(workers, shared_url)
    got = holder.ask(f"acquire paused {TTL}")
    assert got["ok"]
    async with LockService.from_url(shared_url) as locks:
        assert await locks.acquire("paused", ttl=TTL) is None
        holder.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        lock = await locks.acquire("paused", ttl=TTL, wait=TTL + 3)
        assert lock is not None, "a stopped holder's lease must expire"
        await asyncio.sleep(max(0.0, 2 * TTL - (time.monotonic() - stopped)))
        paused_for = time.monotonic() - stopped
        assert paused_for > TTL, "the fault bit: the pause outlasted the TTL"
        holder.signal(signal.SIGCONT)
        answer = holder.ask("release")
        assert answer == {"released": False, "held": False, "lost": True}
        # The new holder is untouched by the stale release and renewal.
        assert lock.held
        [info] = await locks.store.holders("paused")
        assert info.fencing_token == lock.fencing_token > got["fence"]
        assert info.holder == locks.holder
        await asyncio.sleep(TTL / 2)
        assert lock.held
        assert await lock.release() is True


async def test_slow_holder_process_keeps_its_lock_for_3x_ttl(
    shared_url: str, workers: list[Worker]
) -> None:
    [holder] = spawn(workers, shared_url)
    assert holder.ask(f"acquire long {TTL}")["ok"]
    holder.send(f"hold {3 * TTL}")
    attempts = 0
    async with LockService.from_url(shared_url) as locks:
        end = time.monotonic() + 3 * TTL - 0.1
        while time.monotonic() < end:
            assert await locks.acquire("long", ttl=TTL) is None
            attempts += 1
            await asyncio.sleep(0.05)
        answer = holder.read()
        assert answer["held_throughout"] is True
        assert answer["checks"] > 10
        assert attempts > 10
        assert holder.ask("release")["released"] is True
        assert await locks.acquire("long", ttl=TTL) is not None
