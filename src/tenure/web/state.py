"""What ``tenure web`` shows, as JSON-ready data (never a token)."""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from ..control import Control
from ..locks.election import shown
from ..schedule import Scheduler
from ..schedule.view import defined_tasks, run_fields

__all__ = ("AUDIT_SHOWN", "RUNS_SHOWN", "state")

RUNS_SHOWN = 300
AUDIT_SHOWN = 20

_UNDEFINED = {"expression": None, "tz": None, "next_fire": None, "exclusive": None}


async def state(control: Control, scheduler: Scheduler | None) -> dict[str, Any]:
    """The holders; per task (defined by ``scheduler``, registered by a
    serving scheduler, or with run records) its schedule, pause and recent
    runs; the newest audit records."""
    store = control.locks.store
    holders = await store.holders()
    records = await store.runlog.runs(None, RUNS_SHOWN)
    registered = {r.task: r for r in await control.tasks()}
    pauses = await control.pauses()
    by_task: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        by_task[r.task].append(run_fields(r))
    defined = {d["task"]: d for d in defined_tasks(scheduler)}
    tasks = []
    for name in sorted(set(by_task) | set(defined) | set(registered)):
        runs = by_task.get(name, [])
        counts = collections.Counter(run["outcome"] for run in runs)
        known = registered.get(name)
        pause = pauses.get(name)
        tasks.append(
            {
                **defined.get(name, {**_UNDEFINED, "expression": known and known.schedule}),
                "task": name,
                "registered": known is not None,
                "paused": None if pause is None else dataclasses.asdict(pause),
                "recent": runs[:5],
                "skipped": counts["skipped"],
                "failed": counts["failed"],
                "lost": counts["lost"],
            }
        )
    return {
        "store": store.describe(),
        "now": time.time(),
        # LeaseInfo: never a token; an election's term named as such
        # (``lock``: the name an action sends back)
        "holders": [
            {**dataclasses.asdict(h), "name": shown(h.name), "lock": h.name} for h in holders
        ],
        "tasks": tasks,
        "audit": [dataclasses.asdict(a) for a in await control.audit(AUDIT_SHOWN)],
    }
