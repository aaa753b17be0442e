"""The occurrences of paused tasks, in a tick: claimed, then counted or run.

A tick's due occurrences of tasks that the control board says are paused
(``tenure.control``) do not go to ``run_due``. Each one of an exclusive task
is claimed as any occurrence is (one batch call), so that exactly one
instance decides it; the instance that won it counts it in the pause
(``ControlWatch.count_skip``), or, when the pause ended meanwhile, starts it
with the claim it made (resent, the claim answers as its own). An occurrence
of a task that runs on every instance is counted once (the pause keeps the
last fire time counted) and skipped on each.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import TenureError
from ..locks import Outcome

if TYPE_CHECKING:
    from ..control import ControlWatch
    from .tasks import ScheduledTask, ScheduledTaskStore

__all__ = ("hold_paused",)

log = logging.getLogger("tenure.scheduler")

Start = Callable[[str, float, Callable[[], Coroutine[Any, Any, Outcome]]], None]


async def hold_paused(
    tasks: ScheduledTaskStore,
    control: ControlWatch,
    due: Sequence[tuple[str, float]],
    start: Start,
) -> list[tuple[str, float]]:
    """The occurrences of ``due`` whose tasks are not paused, to start as
    usual; those of paused tasks are decided here (see the module docstring)."""
    if not control.paused:
        return list(due)
    free = [(name, fire) for name, fire in due if name not in control.paused]
    held = [(tasks[name], fire) for name, fire in due if name in control.paused]
    exclusive = [(task, fire) for task, fire in held if task.exclusive]
    starts = [tasks.new_start(task, fire) for task, fire in exclusive]
    step = tasks.locks.store.batch_max
    won: list[bool] = []
    try:
        for i in range(0, len(starts), step):
            claims = [claim for claim, _ in starts[i : i + step]]
            won += await tasks.locks.store.runlog.claim_occurrences(claims)
    except TenureError as exc:
        log.warning(
            "%d occurrence(s) of paused tasks could not be claimed (%s): not run, not counted",
            len(starts),
            exc,
        )
        return free
    for (task, fire), begin, mine in zip(exclusive, starts, won, strict=True):
        if not mine:
            tasks.runs.claimed_elsewhere(task.name, fire)
        elif not await _skipped(tasks, control, task, fire):
            start(task.name, fire, functools.partial(tasks.occurrence, task, begin))
    for task, fire in held:
        if not task.exclusive and not await _skipped(tasks, control, task, fire):
            start(task.name, fire, functools.partial(tasks.guarded, task, fire))
    return free


async def _skipped(
    tasks: ScheduledTaskStore, control: ControlWatch, task: ScheduledTask, fire: float
) -> bool:
    """Whether the pause took the occurrence (counted, or counted already)."""
    try:
        if not await control.count_skip(task.name, fire):
            return False
    except TenureError as exc:
        log.warning(
            "task %r: occurrence %s skipped (paused), not counted: %s", task.name, fire, exc
        )
    tasks.runs.paused(task.name, fire)
    return True
