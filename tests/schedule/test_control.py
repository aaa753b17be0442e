"""Control through the store (``tenure.control``): a pause that three
instances obey, counted once per occurrence; a run now, taken by one
instance; the task registry; bad input; the audit records.

On three stores: what differs between stores is their control board, whose
contract (with a race of compare-and-sets) runs on every store
(``tests/contract/test_board.py``); these tests wait on real ticks."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tenure import (
    Control,
    InvalidArgument,
    LockService,
    RequestNotTaken,
    RunOutcome,
    Scheduler,
)
from tenure.control import CONTROL_POLL

from ..conftest import STORES, store_fixtures

kind, _ = store_fixtures({name: STORES[name] for name in ("sqlite", "redis", "postgres")})

Seen = collections.Counter[tuple[str, float | None, str]]


async def until(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check() if asyncio.iscoroutinefunction(check) else not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def cluster(
    url: str, build: Callable[[Scheduler], None]
) -> AsyncIterator[tuple[list[Scheduler], Seen]]:
    """Three instances of one application on ``url``, serving; what each
    occurrence became, over all of them: ``(task, fire time, outcome)`` counts."""
    seen: Seen = collections.Counter()

    def listen(name: str, occurrence: float | None, outcome: str) -> None:
        seen[name, occurrence, outcome] += 1

    async with contextlib.AsyncExitStack() as stack:
        schedulers = []
        for _ in range(3):
            locks = await stack.enter_async_context(LockService.from_url(url))
            scheduler = Scheduler(locks, prune=None, listener=listen)
            build(scheduler)
            schedulers.append(await stack.enter_async_context(scheduler))
        for scheduler in schedulers:
            await asyncio.wait_for(scheduler.control.read_once.wait(), 10)
        yield schedulers, seen


def outcomes(seen: Seen, outcome: str, task: str = "tick") -> list[float]:
    """The fire times of ``task`` told ``outcome``, once per telling."""
    return sorted(
        f
        for (name, f, o), n in seen.items()
        if name == task and o == outcome and f is not None
        for _ in range(n)
    )


def ticking(scheduler: Scheduler) -> None:
    """An every-second task under its lock, and one that runs on every instance."""

    async def tick() -> None:
        await asyncio.sleep(0)

    scheduler.add(tick, "* * * * * *", name="tick")
    scheduler.add(tick, "* * * * * *", name="everywhere", exclusive=False)


async def test_a_pause_is_obeyed_by_every_instance_and_counted_once_per_occurrence(
    url: str,
) -> None:
    async with cluster(url, ticking) as (schedulers, seen), LockService.from_url(url) as ops:
        control = Control(ops, by="ops@test")
        assert [r.task for r in await control.tasks()] == ["everywhere", "tick"]
        await until(lambda: outcomes(seen, RunOutcome.RAN), 5, "a run before the pause")
        pause = await control.pause("tick", reason="maintenance")
        await control.pause("everywhere")
        await until(lambda: all(len(s.control.paused) == 2 for s in schedulers), 5, "all see")
        obeyed = time.time()
        await until(lambda: len(outcomes(seen, RunOutcome.PAUSED)) >= 2, 5, "two skips")
        record = await control.resume("tick")
        assert record.ended is not None
        resumed = record.ended
        everywhere = await control.resume("everywhere")
        await until(lambda: max(outcomes(seen, RunOutcome.RAN)) > resumed, 5, "a run after")
    skipped, ran = outcomes(seen, RunOutcome.PAUSED), outcomes(seen, RunOutcome.RAN)
    assert len(skipped) >= 2 and len(skipped) == len(set(skipped)), "each skip told once"
    assert len(ran) == len(set(ran)), "each occurrence ran once"
    assert not set(skipped) & set(ran), "an occurrence is run or skipped, never both"
    assert not [f for f in ran if obeyed < f < skipped[-1]], "no run once all saw the pause"
    every = [float(t) for t in range(int(min(ran)), int(max(ran)) + 1)]
    assert sorted(ran + skipped) == every, "and never neither: nothing lost"
    # The task of every instance: skipped on each, counted once per occurrence.
    # (Each instance obeys from its own read of the board: before ``obeyed``
    # one may still run an occurrence that another skips.)
    on_each = outcomes(seen, RunOutcome.PAUSED, "everywhere")
    assert on_each and set(on_each) & set(skipped), "paused together"
    ran_on_each = outcomes(seen, RunOutcome.RAN, "everywhere")
    assert not {f for f in on_each if f > obeyed} & set(ran_on_each)
    assert everywhere.error is not None
    assert everywhere.error.endswith(f"; {len(set(on_each))} occurrence(s) skipped")
    assert record.outcome == RunOutcome.PAUSED
    assert (record.run_id, record.started, record.instance) == (
        pause.pause_id,
        pause.since,
        "ops@test",
    )
    assert record.ended is not None and record.ended >= pause.since
    resumed_by = f"resumed by ops@test; {len(skipped)} occurrence(s) skipped"
    assert record.error == f"paused by ops@test: maintenance; {resumed_by}"
    async with LockService.from_url(url) as reader:
        runs = await reader.store.runlog.runs("tick", 1000)
        assert [r for r in runs if r.outcome == RunOutcome.PAUSED] == [record], "one record"
        actions = await Control(reader).audit()
        assert [(a.action, a.target, a.who) for a in actions] == [
            ("resume", "everywhere", "ops@test"),
            ("resume", "tick", "ops@test"),
            ("pause", "everywhere", "ops@test"),
            ("pause", "tick", "ops@test"),
        ]
        assert actions[1].detail == f"{len(skipped)} occurrence(s) skipped"


def yearly(calls: list[str]) -> Callable[[Scheduler], None]:
    def build(scheduler: Scheduler) -> None:
        async def report() -> None:
            calls.append(scheduler.locks.holder)

        scheduler.add(report, "0 0 1 1 *", name="report")

    return build


async def test_a_run_now_is_taken_by_one_instance_and_recorded_as_manual(url: str) -> None:
    calls: list[str] = []
    async with cluster(url, yearly(calls)) as (schedulers, _), LockService.from_url(url) as ops:
        control = Control(ops)
        asked = time.time()
        record = await control.trigger("report")
        await until(lambda: calls, 5, "the run")
        await asyncio.sleep(1.2 * CONTROL_POLL)  # every instance read the board again: none ran it
        assert calls == [record.instance]
        assert record.instance in {s.locks.holder for s in schedulers}
        assert record.fire_time is None and record.started >= asked - 1
        assert sum(s.control.taken for s in schedulers) == 1
        runs = await ops.store.runlog.runs("report")
        assert [(r.run_id, r.outcome) for r in runs] == [(record.run_id, RunOutcome.RAN)]
        assert [a.action for a in await control.audit()] == ["trigger"]


async def test_a_run_now_that_no_instance_takes_fails_and_is_withdrawn(url: str) -> None:
    calls: list[str] = []
    async with cluster(url, yearly(calls)):
        pass  # they registered the task, and stopped
    async with LockService.from_url(url) as ops:
        control = Control(ops)
        began = time.monotonic()
        with pytest.raises(RequestNotTaken, match="no instance serving task 'report' took"):
            await control.trigger("report", wait=0.5)
        assert time.monotonic() - began >= 0.5
        assert await ops.store.runlog.board("control") == {}
        assert calls == [] and await ops.store.runlog.runs("report") == []


async def test_bad_input_is_refused_and_changes_nothing(url: str) -> None:
    async with cluster(url, ticking), LockService.from_url(url) as ops:
        control = Control(ops)
        with pytest.raises(
            InvalidArgument,
            match="no scheduler serves a task named 'tock'; known: everywhere, tick",
        ):
            await control.pause("tock")
        with pytest.raises(InvalidArgument, match="no scheduler serves a task named 'tock'"):
            await control.trigger("tock")
        with pytest.raises(InvalidArgument, match="task 'tick' is not paused: nothing changed"):
            await control.resume("tick")
        with pytest.raises(InvalidArgument, match="lock 'free' is not held"):
            await control.force_release("free")
        with pytest.raises(InvalidArgument, match="wait must be a positive number"):
            await control.trigger("tick", wait=0)
        with pytest.raises(InvalidArgument, match="task name must not be empty"):
            await control.pause("")
        assert await ops.store.runlog.board("control") == {}
        assert await control.audit() == []
        await control.pause("tick")
        board = await ops.store.runlog.board("control")
        with pytest.raises(InvalidArgument, match=r"task .tick. is paused already since .* by "):
            await control.pause("tick")
        assert await ops.store.runlog.board("control") == board
        assert len(await control.audit()) == 1
