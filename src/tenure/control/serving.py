"""A scheduler's side of control: it registers its tasks and obeys the board.

Every scheduler (asyncio and blocking, the Django runner, the Celery beat
scheduler) runs one :class:`ControlWatch` while it serves:

* **Registry.** As it starts, and hourly after, it writes a
  ``Registration`` of each of its tasks (kind ``tasks``), so that the CLI and
  the page know the names and refuse others. A registration not refreshed for
  ``REGISTRY_KEEP`` (7 days) is dropped: a task removed from the code leaves
  the list a week after its last scheduler stopped.
* **Board.** Every ``CONTROL_POLL`` (1 s) it reads the ``control`` kind (one
  store call): the pauses, and the requests to run now. A pause is obeyed from
  the next read on; a request for a task it serves is taken with a
  compare-and-set that only one instance wins, and run at once.
* **Skips.** An occurrence of a paused task is claimed as usual (so exactly
  one instance decides it), then counted in the pause's entry with a
  compare-and-set (:meth:`ControlWatch.count_skip`). When the entry is gone
  by then (resumed meanwhile), the occurrence runs after all: every
  occurrence is either run or counted, never both and never neither.

While the store cannot be reached, it keeps the last board it read and says
so once in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import TenureError
from .records import (
    CONTROL,
    RUN,
    TASKS,
    Pause,
    Registration,
    RunRequest,
    decode,
    encode,
    pause_key,
    pauses_of,
)

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ("CONTROL_POLL", "REGISTER_EVERY", "REGISTRY_KEEP", "ControlWatch")

log = logging.getLogger("tenure.control")

CONTROL_POLL = 1.0
"""Seconds between two reads of the board by a serving scheduler."""
REGISTER_EVERY = 3600.0
REGISTRY_KEEP = 7 * 86400.0
COUNT_TRIES = 10


class ControlWatch:
    """The board as one serving scheduler sees it (see the module docstring).

    ``tasks()`` gives the names it serves with their schedules (read as it
    starts); ``take`` is called with each run request it won, on its loop;
    requests are taken only while ``serving()`` (a Celery beat that does not
    send leaves them to the one that does)."""

    def __init__(
        self,
        store: Store,
        instance: str,
        tasks: Callable[[], Mapping[str, str]],
        take: Callable[[RunRequest], None],
        *,
        keep_runs: int,
        poll: float = CONTROL_POLL,
        serving: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self._serving = serving
        self.instance = instance
        self._tasks = tasks
        self._take = take
        self.keep_runs = keep_runs
        self.poll = poll
        self._entries: dict[str, str] = {}
        self.paused: dict[str, Pause] = {}
        """The pauses as last read, by task."""
        self.taken = 0
        """Run requests this instance took."""
        self._failing = False
        self.read_once = asyncio.Event()
        """Set after the first read of the board (a test waits for it)."""

    async def watch(self) -> None:
        """Register, then read the board every ``poll`` seconds until cancelled."""
        registered = -REGISTER_EVERY
        while True:
            now = time.monotonic()
            try:
                if now - registered >= REGISTER_EVERY:
                    await self.register()
                    registered = now
                await self.read()
                if self._failing:
                    log.warning("the control board can be read again")
                    self._failing = False
            except TenureError as exc:
                if not self._failing:
                    log.warning(
                        "cannot read the control board (pauses and run requests are "
                        "as last read): %s",
                        exc,
                    )
                    self._failing = True
            await asyncio.sleep(self.poll)

    async def register(self) -> None:
        """Write a registration of each task served; drop registrations stale
        for ``REGISTRY_KEEP``."""
        board = self.store.runlog
        now = time.time()
        rows = {
            name: encode(Registration(name, schedule, self.instance, now, self.keep_runs))
            for name, schedule in self._tasks().items()
        }
        names = sorted(rows)
        step = self.store.batch_max
        for i in range(0, len(names), step):
            await board.board_put(TASKS, {name: rows[name] for name in names[i : i + step]})
        for name, value in (await board.board(TASKS)).items():
            with contextlib.suppress(TenureError):
                if decode(Registration, TASKS, name, value).seen < now - REGISTRY_KEEP:
                    await board.board_swap(TASKS, name, value, None)

    async def read(self) -> None:
        """Read the board once: the pauses; the run requests this instance wins."""
        entries = await self.store.runlog.board(CONTROL)
        self._entries = entries
        self.paused = pauses_of(entries)
        self.read_once.set()
        served = self._tasks() if self._serving() else {}
        for key, value in entries.items():
            if not key.startswith(RUN):
                continue
            request = decode(RunRequest, CONTROL, key, value)
            if request.task in served and await self.store.runlog.board_swap(
                CONTROL, key, value, None
            ):
                self.taken += 1
                log.info("task %r: run now, as %s asked", request.task, request.by)
                self._take(request)

    async def count_skip(self, task: str, fire: float) -> bool:
        """Count the occurrence ``fire`` of ``task`` as skipped by its pause:
        True when it is (by this call or another instance's, for a task
        without a claim), False when the task is not paused any more (run it)."""
        key = pause_key(task)
        value = self._entries.get(key)
        board = self.store.runlog
        for _ in range(COUNT_TRIES):
            if value is None:
                self.paused.pop(task, None)
                return False
            pause = decode(Pause, CONTROL, key, value)
            if pause.last is not None and pause.last >= fire:
                return True
            new = encode(dataclasses.replace(pause, skipped=pause.skipped + 1, last=fire))
            if await board.board_swap(CONTROL, key, value, new):
                self._entries[key] = new
                return True
            value = (await board.board(CONTROL)).get(key)
        log.warning(
            "task %r: occurrence %s skipped (paused), not counted: too contended", task, fire
        )
        return True
