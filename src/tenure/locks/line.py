"""The callers of one process waiting for one name, in line.

Only the first of them waits on the store (one notification, one retry per
release); the others wait for their turn here, costing the store nothing. A
release therefore wakes one waiter of this process, not all of them, and
n waiters on one name cost n handoffs, not n².
"""

from __future__ import annotations

import asyncio
import collections
import weakref

from .._validate import check_count
from ..errors import WaitQueueFull

__all__ = ("WAITERS", "Line")

WAITERS = 1000
"""Callers that may wait for one name in one LockService at once, by default."""


class Line:
    """Per name, the callers of this process waiting for it, first come first served.

    ``join`` returns a future that is done when the caller is first in line;
    ``leave`` (always, in a ``finally``) passes the turn to the next. Lines are
    per event loop: a service used from two loops keeps two lines per name.
    """

    def __init__(self, bound: int = WAITERS) -> None:
        self.bound = check_count(bound, "waiters")
        self._lines: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, collections.deque[asyncio.Future[None]]]
        ] = weakref.WeakKeyDictionary()
        self.store_waits = 0
        """Waits on the store by the first in line: one per release it hears of
        (a spurious wake-up or a lease's expiry adds one). A test reads it."""

    def _of_loop(self) -> dict[str, collections.deque[asyncio.Future[None]]]:
        loop = asyncio.get_running_loop()
        lines = self._lines.get(loop)
        if lines is None:
            lines = self._lines[loop] = {}
        return lines

    def waiting(self, name: str) -> int:
        """Callers of this loop in line for ``name`` (the first one included)."""
        line = self._of_loop().get(name)
        return len(line) if line is not None else 0

    def join(self, name: str) -> asyncio.Future[None]:
        """Queue for ``name``; WaitQueueFull when ``bound`` callers already are."""
        lines = self._of_loop()
        line = lines.get(name)
        if line is None:
            line = lines[name] = collections.deque()
        elif len(line) >= self.bound:
            raise WaitQueueFull(
                f"{len(line)} callers already wait for lock {name!r} in this LockService, "
                f"its bound (waiters={self.bound}); raise it, or wait less (a shorter wait=)"
            )
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not line:
            turn.set_result(None)
        line.append(turn)
        return turn

    def leave(self, name: str, turn: asyncio.Future[None]) -> None:
        """Leave the line; the next caller's turn comes if this one had it."""
        lines = self._of_loop()
        line = lines.get(name)
        if line is None:
            return
        if line and line[0] is turn:
            line.popleft()
            if line:
                line[0].set_result(None)
        else:
            try:
                line.remove(turn)
            except ValueError:
                pass
        if not line:
            del lines[name]
