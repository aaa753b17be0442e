"""A tick's occurrences spread over the serving instances (``schedule._spread``)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

from tenure import LockService, RunOutcome, Scheduler
from tenure.schedule._spread import PEERS_REFRESH, Spread
from tenure.stores.runlog import presence_name

TASKS = [f"task-{i}" for i in range(3000)]


def preferred(peers: set[str]) -> dict[str, str]:
    """Each task's preferred instance, as each instance's Spread sees it."""
    found: dict[str, str] = {}
    for me in peers:
        spread = Spread(me)
        spread.update(peers, me)
        for task in TASKS:
            if spread.mine(task):
                assert task not in found, f"{task} is preferred by two instances"
                found[task] = me
    return found


def test_each_task_has_one_preferred_instance_and_they_share_evenly() -> None:
    owners = preferred({"a", "b", "c"})
    assert len(owners) == len(TASKS), "every task has its instance"
    shares = collections.Counter(owners.values())
    assert all(800 <= share <= 1200 for share in shares.values()), shares


def test_an_instance_leaving_moves_only_its_own_tasks() -> None:
    before = preferred({"a", "b", "c"})
    after = preferred({"a", "b"})
    moved = [task for task in TASKS if before[task] != after[task]]
    assert moved and all(before[task] == "c" for task in moved)


def test_alone_every_task_is_its_own() -> None:
    spread = Spread("solo")
    assert all(spread.mine(task) for task in TASKS)


Ran = collections.Counter[float]


def _schedulers(instances: list[LockService], tasks: int) -> tuple[list[Scheduler], list[Ran]]:
    """A scheduler per service, each with the same ``tasks`` every-second tasks;
    and the occurrences each one ran, by fire time."""
    schedulers: list[Scheduler] = []
    ran: list[Ran] = []
    for locks in instances:
        mine: Ran = collections.Counter()

        def listen(_: str, occurrence: float | None, outcome: str, mine: Ran = mine) -> None:
            if outcome == RunOutcome.RAN and occurrence is not None:
                mine[occurrence] += 1

        scheduler = Scheduler(locks, prune=None, listener=listen)
        for i in range(tasks):

            async def run() -> None:
                await asyncio.sleep(0)

            scheduler.add(run, "* * * * * *", name=f"t{i}")
        schedulers.append(scheduler)
        ran.append(mine)
    return schedulers, ran


async def test_three_instances_share_each_tick(tmp_path: Path) -> None:
    """Once they know of each other, each instance runs about a third of every
    tick, and every occurrence still runs once."""
    url = f"sqlite://{tmp_path}/spread.db"
    async with (
        LockService.from_url(url) as a,
        LockService.from_url(url) as b,
        LockService.from_url(url) as c,
    ):
        schedulers, ran = _schedulers([a, b, c], 60)
        serving = [asyncio.ensure_future(s.serve()) for s in schedulers]
        for scheduler in schedulers:
            await scheduler.tasks.presence.ready(10)
        for scheduler in schedulers:
            await scheduler.tasks.read_peers()
            assert len(scheduler.tasks.spread.peers) == 3
        spread_at = time.time()
        calls_before = [scheduler.tasks.store_calls for scheduler in schedulers]
        await asyncio.sleep(3.2)
        stopped_at = time.time()
        for scheduler in schedulers:
            scheduler.stop()
        await asyncio.gather(*serving)
        ticks = sorted({fire for mine in ran for fire in mine if spread_at < fire < stopped_at - 1})
        assert len(ticks) >= 2, "the instances served together for two ticks"
        for fire in ticks:
            shares = [mine[fire] for mine in ran]
            assert sum(shares) == 60, f"every occurrence of {fire} ran once: {shares}"
            assert all(share >= 8 for share in shares), f"spread at {fire}: {shares}"
        served = math.ceil(stopped_at) - math.ceil(spread_at)
        for scheduler, before in zip(schedulers, calls_before, strict=True):
            calls = scheduler.tasks.store_calls - before
            # Each tick: one start batch for its own tasks, one read that finds
            # the others' taken, and no start sent for those to lose.
            assert calls["claimed"] >= 2, calls
            assert calls["start"] <= served + 1, (calls, served)


async def test_the_share_of_a_dead_instance_still_runs(tmp_path: Path) -> None:
    """A presence lease whose instance never claims (dead, stalled, or another
    app's): its preferred tasks are claimed by the live instance after the
    spread delay, every occurrence once."""
    url = f"sqlite://{tmp_path}/ghost.db"
    async with (
        LockService.from_url(url) as locks,
        LockService.from_url(url, holder="ghost") as ghost,
    ):
        presence = await ghost.acquire(presence_name("ghost"), ttl=30)
        assert presence is not None
        [scheduler], [ran] = _schedulers([locks], 40)
        serving = asyncio.ensure_future(scheduler.serve())
        await scheduler.tasks.presence.ready(10)
        await scheduler.tasks.read_peers()
        spread = scheduler.tasks.spread
        assert spread.peers == {"ghost", locks.holder}
        ghosts = [f"t{i}" for i in range(40) if not spread.mine(f"t{i}")]
        assert ghosts, "some tasks prefer the ghost"
        await asyncio.sleep(2.5)
        scheduler.stop()
        await serving
        records = await locks.store.runlog.runs(None, 1000)
        by_task = collections.Counter(r.task for r in records if r.outcome == RunOutcome.RAN)
        for name in ghosts:
            assert by_task[name] >= 2, f"{name} (the ghost's) ran every tick: {by_task[name]}"
        occurrences = collections.Counter((r.task, r.fire_time) for r in records)
        assert max(occurrences.values()) == 1, "no occurrence ran twice"
        assert sum(ran.values()) == sum(by_task.values()), "what ran is what was recorded"
        await presence.release()


async def _until_known(spread: Spread, peer: str, since: float, most: float) -> float:
    """Seconds from ``since`` (monotonic) until ``spread`` knows ``peer``, at most ``most``."""
    for _ in range(int(most / 0.05)):
        if peer in spread.peers:
            break
        await asyncio.sleep(0.05)
    return time.monotonic() - since


@contextlib.asynccontextmanager
async def _serving_alone(
    tmp_path: Path, tasks: int, other: str
) -> AsyncIterator[tuple[Scheduler, LockService]]:
    """A scheduler of ``tasks`` tasks serving on a SQLite file where it is the
    only instance so far, and a service of holder ``other`` on the same file;
    the scheduler is stopped on the way out."""
    url = f"sqlite://{tmp_path}/{other}.db"
    async with (
        LockService.from_url(url) as locks,
        LockService.from_url(url, holder=other) as service,
    ):
        [scheduler], _ = _schedulers([locks], tasks)
        serving = asyncio.ensure_future(scheduler.serve())
        await scheduler.tasks.presence.ready(10)
        try:
            yield scheduler, service
        finally:
            scheduler.stop()
            await serving


async def test_an_instance_that_finds_its_own_occurrences_taken_reads_the_instances_again(
    tmp_path: Path,
) -> None:
    """An instance that started later is known to the others within a second
    or two, not only at their next regular read of the instances: the first
    occurrence of its own that an instance finds claimed elsewhere makes it
    read them again."""
    async with _serving_alone(tmp_path, 20, "newcomer") as (scheduler, newcomer):
        # Past its first seconds, when it reads the instances every second anyway.
        await asyncio.sleep(PEERS_REFRESH + 0.5)
        await scheduler.tasks.read_peers()
        spread = scheduler.tasks.spread
        assert spread.peers == {scheduler.locks.holder}, "alone: every task is its own"
        joined = time.monotonic()
        presence = await newcomer.acquire(presence_name("newcomer"), ttl=30)
        assert presence is not None
        # The newcomer claims the next occurrences of every task, as an
        # instance that reached the store first would.
        ahead = math.ceil(time.time()) + 3.0
        for i in range(20):
            assert await newcomer.store.runlog.claim_occurrence(f"t{i}", ahead, "newcomer/1")
        known_after = await _until_known(spread, "newcomer", joined, 4.0)
        await presence.release()
    assert scheduler.tasks.counts["claimed_elsewhere"] > 0, "it found its own taken"
    assert "newcomer" in spread.peers, "it read the instances again"
    assert known_after < 4.0 < PEERS_REFRESH, known_after


async def test_a_starting_instance_reads_the_instances_every_second(tmp_path: Path) -> None:
    """Instances that start together may miss each other at their first read:
    during its first seconds an instance reads them every second, so an
    instance that appears then is known soon even if it never claims first."""
    async with _serving_alone(tmp_path, 5, "sibling") as (scheduler, sibling):
        await asyncio.sleep(0.3)  # serve()'s own first read of the instances is done
        spread = scheduler.tasks.spread
        assert spread.peers == {scheduler.locks.holder}
        appeared = time.monotonic()
        presence = await sibling.acquire(presence_name("sibling"), ttl=30)
        assert presence is not None
        known_after = await _until_known(spread, "sibling", appeared, 3.0)
        await presence.release()
    assert "sibling" in spread.peers, "it read the instances again while starting"
    assert known_after < 3.0 < PEERS_REFRESH, known_after
