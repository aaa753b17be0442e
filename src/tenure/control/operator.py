"""``Control``: an operator's actions on a cluster, through the store.

Pause and resume a task, run it now, free a stuck lock; list the tasks the
schedulers serve and the audit records of what operators did. Everything goes
through the store's control board (``stores.board``), so every instance
obeys, whichever one the operator reached; the CLI (``tenure pause``,
``resume``, ``trigger``, ``release --force``) and the web page both act
through this class. Each action that changed something leaves an audit record
(:class:`Action`: who, what, when); the store keeps the newest ``AUDIT_KEEP``.

A paused task's occurrences run on no instance from the schedulers' next read
of the board (within ``CONTROL_POLL``, a second); its pause is one run record
(outcome ``paused``) written as it starts and again as it ends, with the
number of occurrences it skipped. A run request waits in the store until an
instance that serves the task takes it (within a second while one serves);
one not taken within ``wait`` seconds is withdrawn and ends with
``RequestNotTaken``. A requested run goes as a manual run does: under the
task's lock (``skipped`` while an occurrence holds it), recorded with no fire
time, and whether or not the task is paused.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time

from .._validate import check_name
from ..errors import InvalidArgument, RequestNotTaken, TenureError
from ..locks import LockService
from ..stores.audit import ForcedRelease, operator_id
from ..stores.runlog import RunOutcome, RunRecord
from .records import (
    AUDIT,
    CONTROL,
    TASKS,
    Action,
    Pause,
    Registration,
    RunRequest,
    decode,
    encode,
    pause_key,
    pauses_of,
    request_key,
)

__all__ = ("AUDIT_KEEP", "TRIGGER_WAIT", "Control")

AUDIT_KEEP = 1000
"""How many audit records a store keeps (the newest)."""
TRIGGER_WAIT = 10.0
"""Seconds a run request waits for an instance to take it, by default."""
RECORD_WAIT = 5.0
"""Seconds, after a request was taken, to wait for its run's start record."""
POLL = 0.1


class Control:
    """The actions of the operator ``by`` (default ``user@host:pid``) on the
    store of ``locks`` (see the module docstring)."""

    def __init__(self, locks: LockService, *, by: str | None = None) -> None:
        if by is not None and (not isinstance(by, str) or not by.strip()):
            raise InvalidArgument(f"by must name the operator, got {by!r}")
        self.locks = locks
        self.board = locks.store.runlog
        self.by = by or operator_id()

    async def tasks(self) -> list[Registration]:
        """The tasks the schedulers registered, by name."""
        entries = await self.board.board(TASKS)
        return [decode(Registration, TASKS, key, entries[key]) for key in sorted(entries)]

    async def registration(self, task: str) -> Registration:
        """The registration of ``task``; InvalidArgument naming the known ones
        when no scheduler registered it."""
        check_name(task, "task name")
        known = {r.task: r for r in await self.tasks()}
        if task not in known:
            names = ", ".join(sorted(known)) or "none: no scheduler has served on this store"
            raise InvalidArgument(f"no scheduler serves a task named {task!r}; known: {names}")
        return known[task]

    async def pauses(self) -> dict[str, Pause]:
        """The pauses in effect, by task."""
        return pauses_of(await self.board.board(CONTROL))

    async def pause(self, task: str, *, reason: str | None = None) -> Pause:
        """Pause ``task`` on every instance until :meth:`resume`."""
        _check_reason(reason)
        known = await self.registration(task)
        pause = Pause(secrets.token_hex(8), task, time.time(), self.by, reason)
        if not await self.board.board_swap(CONTROL, pause_key(task), None, encode(pause)):
            current = (await self.pauses()).get(task)
            since = "" if current is None else f" since {_utc(current.since)} by {current.by}"
            raise InvalidArgument(f"task {task!r} is paused already{since}: nothing changed")
        await self.board.record_run(_record(pause, None), keep=known.keep_runs)
        await self._audit("pause", task, reason or "")
        return pause

    async def resume(self, task: str) -> RunRecord:
        """End the pause of ``task``; returns its run record, now ended, with
        how many occurrences it skipped."""
        check_name(task, "task name")
        key = pause_key(task)
        while True:
            value = (await self.board.board(CONTROL)).get(key)
            if value is None:
                raise InvalidArgument(f"task {task!r} is not paused: nothing changed")
            if await self.board.board_swap(CONTROL, key, value, None):
                break
        pause = decode(Pause, CONTROL, key, value)
        record = _record(pause, time.time(), resumed_by=self.by)
        known = {r.task: r for r in await self.tasks()}.get(task)
        keep = known.keep_runs if known is not None else 1_000_000
        await self.board.record_run(record, keep=keep)
        await self._audit("resume", task, f"{pause.skipped} occurrence(s) skipped")
        return record

    async def trigger(self, task: str, *, wait: float = TRIGGER_WAIT) -> RunRecord:
        """Have one instance that serves ``task`` run it now, once in the
        cluster; returns the start record of its run (``running``, or how it
        already ended). RequestNotTaken when none took it within ``wait`` s."""
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not wait > 0:
            raise InvalidArgument(f"wait must be a positive number of seconds, got {wait!r}")
        if math.isinf(wait):
            raise InvalidArgument("wait must be finite: a request nobody takes would wait for ever")
        await self.registration(task)
        request = RunRequest(secrets.token_hex(8), task, time.time(), self.by)
        key, value = request_key(request.request_id), encode(request)
        await self.board.board_swap(CONTROL, key, None, value)
        await self._audit("trigger", task, f"run {request.request_id}")
        deadline = time.monotonic() + wait
        while key in await self.board.board(CONTROL):
            if time.monotonic() >= deadline:
                if await self.board.board_swap(CONTROL, key, value, None):
                    raise RequestNotTaken(
                        f"no instance serving task {task!r} took the request to run it within "
                        f"{wait:g} s: is a scheduler with this task running on this store? "
                        "The request was withdrawn; nothing ran"
                    )
                break  # taken at the last moment
            await asyncio.sleep(POLL)
        return await self._started(task, request.request_id)

    async def _started(self, task: str, run_id: str) -> RunRecord:
        deadline = time.monotonic() + RECORD_WAIT
        while True:
            for record in await self.board.runs(task, 20):
                if record.run_id == run_id:
                    return record
            if time.monotonic() >= deadline:
                raise TenureError(
                    f"an instance took the request to run task {task!r} (run {run_id}), "
                    f"but no record of the run appeared within {RECORD_WAIT:g} s: see "
                    "`tenure tasks` and the instances' logs"
                )
            await asyncio.sleep(POLL)

    async def force_release(self, name: str, *, reason: str | None = None) -> ForcedRelease:
        """Free the lock ``name`` whoever holds it (``LockService.force_release``),
        as this operator; InvalidArgument when it is not held."""
        _check_reason(reason)
        record = await self.locks.force_release(name, operator=self.by, reason=reason)
        if record is None:
            raise InvalidArgument(
                f"lock {name!r} is not held (or changed hands meanwhile): nothing freed"
            )
        detail = f"evicted {record.evicted} (fencing token {record.fencing_token})"
        await self._audit("force-release", name, detail + (f": {reason}" if reason else ""))
        return record

    async def audit(self, limit: int = 50) -> list[Action]:
        """The newest audit records, newest first."""
        entries = await self.board.board(AUDIT)
        actions = [decode(Action, AUDIT, key, value) for key, value in entries.items()]
        actions.sort(key=lambda action: action.at, reverse=True)
        return actions[:limit]

    async def _audit(self, action: str, target: str, detail: str) -> None:
        record = Action(secrets.token_hex(8), time.time(), self.by, action, target, detail)
        await self.board.board_put(AUDIT, {record.action_id: encode(record)})
        entries = await self.board.board(AUDIT)
        if len(entries) > AUDIT_KEEP:
            by_age = sorted(entries.items(), key=lambda e: decode(Action, AUDIT, *e).at)
            for key, value in by_age[: len(entries) - AUDIT_KEEP]:
                await self.board.board_swap(AUDIT, key, value, None)


def _check_reason(reason: object) -> None:
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgument(f"reason must be a string or None, got {reason!r}")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _record(pause: Pause, ended: float | None, resumed_by: str | None = None) -> RunRecord:
    """A pause's run record: in effect (``ended`` None), or ended."""
    why = f"paused by {pause.by}" + (f": {pause.reason}" if pause.reason else "")
    if ended is None:
        what = f"{why}; in effect"
    else:
        what = f"{why}; resumed by {resumed_by}; {pause.skipped} occurrence(s) skipped"
    return RunRecord(
        run_id=pause.pause_id,
        task=pause.task,
        fire_time=None,
        instance=pause.by,
        started=pause.since,
        ended=ended,
        outcome=RunOutcome.PAUSED,
        error=what,
    )
