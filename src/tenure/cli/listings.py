"""``tenure tasks`` and ``tenure locks``: what ran, who holds what, and what was forced free."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from ..control import Control, Pause
from ..locks import LockService
from ..locks.election import shown
from ..schedule.view import defined_tasks, run_fields
from ..stores import from_url as store_from_url
from ..stores.audit import FORCED_KEEP
from ..stores.base import Store
from ..stores.runlog import RunOutcome, RunRecord
from .common import load_scheduler, stamp, url_of

T = TypeVar("T")


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, right: int = 0) -> list[str]:
    """The lines of ``rows`` under ``header``, each column as wide as its
    widest cell: nothing is ever cut (a cut lock or task name misleads in an
    incident). The last ``right`` columns are right-aligned."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    first_right = len(header) - right
    return [
        "  ".join(
            cell.rjust(width) if i >= first_right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in (header, *rows)
    ]


def note(label: str, text: str) -> str:
    """A long field (an error, a reason) as lines of its own under its row:
    wrapped at 80 columns, not cut."""
    return textwrap.fill(text, 80, initial_indent=f"    {label}: ", subsequent_indent=" " * 6)


def when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


async def _read(url: str, read: Callable[[Store], Awaitable[T]]) -> T:
    """What ``read`` reads from the store at ``url``, which is closed after."""
    store = store_from_url(url)
    try:
        return await read(store)
    finally:
        await store.aclose()


async def tasks(
    url: str | None, task: str | None, limit: int, as_json: bool, app: str | None
) -> None:
    scheduler = None
    if app is not None:
        scheduler, locks = load_scheduler(app, url, reading=True)
    else:
        locks = LockService.from_url(url_of(url, reading=True))
    async with locks:
        records = await locks.store.runlog.runs(task, limit)
        control = Control(locks)
        registered, pauses = await control.tasks(), await control.pauses()
    defined = defined_tasks(scheduler, task)
    if as_json:
        runs = [run_fields(r) for r in records]
        print(json.dumps({"tasks": defined, "runs": runs} if app else runs, indent=2))
        return
    served = [r for r in registered if task is None or r.task == task]
    if served and not defined:
        state = [(r.task, r.schedule, _state(r.task, pauses), r.instance) for r in served]
        print("\n".join(table(("task", "schedule", "state", "registered by"), state)))
        print()
    if defined:
        plan = [(d["task"], d["expression"], when(d["next_fire"]), d["tz"]) for d in defined]
        print("\n".join(table(("task", "expression", "next fire (UTC)", "tz"), plan)))
        print()
    if not records:
        print("no run records")
        return
    rows = [
        (
            r.task,
            _occurrence(r),
            r.instance,
            "-" if r.ended is None else f"{r.ended - r.started:.2f}s",
            str(r.outcome),
        )
        for r in records
    ]
    head, *lines = table(("task", "occurrence (UTC)", "instance", "took", "outcome"), rows)
    print(head)
    for line, r in zip(lines, records, strict=True):
        print(line)
        if r.error:
            print(note("error", r.error))


def _occurrence(record: RunRecord) -> str:
    if record.fire_time is not None:
        return when(record.fire_time)
    return "-" if record.outcome == RunOutcome.PAUSED else "manual"


def _state(task: str, pauses: dict[str, Pause]) -> str:
    pause = pauses.get(task)
    if pause is None:
        return "serving"
    return f"paused since {when(pause.since)} by {pause.by}, {pause.skipped} skipped"


async def locks(url: str, prefix: str, as_json: bool) -> None:
    infos = await _read(url, lambda store: store.holders(prefix))
    if as_json:
        print(json.dumps([dataclasses.asdict(i) for i in infos], indent=2))
        return
    if not infos:
        print(f"no lock is held{f' with a name starting {prefix!r}' if prefix else ''}")
        return
    rows = [
        (
            shown(i.name),
            i.holder,
            str(i.fencing_token),
            stamp(i.acquired_at) if i.acquired_at is not None else "?",
            f"{i.expires_in:.1f}s",
        )
        for i in infos
    ]
    header = ("lock", "holder", "fencing token", "acquired", "expires in")
    print("\n".join(table(header, rows, right=3)))
    print(f"{len(infos)} held; times UTC")


async def forced(url: str, prefix: str, as_json: bool) -> None:
    every = await _read(url, lambda store: store.runlog.forced_releases(limit=FORCED_KEEP))
    records = [r for r in every if r.name.startswith(prefix)][:50]
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in records], indent=2))
        return
    if not records:
        print(f"no forced release recorded{f' of a lock starting {prefix!r}' if prefix else ''}")
        return
    rows = [(when(r.at), r.name, r.evicted, r.operator) for r in records]
    head, *lines = table(("when (UTC)", "lock", "evicted", "freed by"), rows)
    print(head)
    for line, r in zip(lines, records, strict=True):
        print(line)
        if r.reason:
            print(note("why", r.reason))
