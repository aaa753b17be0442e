"""The tasks as an operator sees them, written once for ``tenure tasks`` and
``tenure web``: each defined task's schedule and next fire, and run records as
JSON-ready data (never a secret token, never the record's internal key)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ..stores.runlog import RunRecord
from .scheduler import Scheduler

__all__ = ("defined_tasks", "run_fields")


def defined_tasks(scheduler: Scheduler | None, task: str | None = None) -> list[dict[str, Any]]:
    """Each task of ``scheduler`` (only ``task`` when given), in definition
    order: name, cron expression, time zone, next fire (a Unix time), and
    whether it runs under its lock."""
    if scheduler is None:
        return []
    now = time.time()
    return [
        {
            "task": t.name,
            "expression": t.schedule.expr,
            "tz": str(t.schedule.tz),
            "next_fire": t.schedule.next_after(now),
            "exclusive": t.exclusive,
        }
        for t in scheduler.tasks
        if task is None or t.name == task
    ]


def run_fields(record: RunRecord) -> dict[str, Any]:
    """A run record's fields for a script or a page."""
    fields = dataclasses.asdict(record)
    del fields["run_id"]  # an internal key of the record, not for scripts
    return fields
