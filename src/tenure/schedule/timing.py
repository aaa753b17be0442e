"""A task's schedule: a cron expression (``cron``) or an interval (``interval``),
chosen once at registration, read alike by the timer loop, ``tenure tasks``
and the web page."""

from __future__ import annotations

from typing import Protocol
from zoneinfo import ZoneInfo

from ..errors import InvalidArgument
from .cron import CronSchedule
from .interval import IntervalSchedule

__all__ = ("Schedule", "schedule_of")


class Schedule(Protocol):
    """What the timer loop, ``tenure tasks`` and the web page read of a task's
    schedule: a cron expression (``CronSchedule``) or an interval."""

    expr: str
    """How it is shown: the cron expression, or ``every 30s``."""
    tz: ZoneInfo

    def next_after(self, t: float) -> float:
        """The first fire time strictly after ``t`` (POSIX seconds)."""
        ...

    def latest_at_or_before(self, t: float) -> float:
        """The last fire time at or before ``t``."""
        ...


def schedule_of(expr: str | None, every: float | None, tz: str | None) -> Schedule:
    """The schedule of a task registered with ``expr`` or ``every`` (exactly
    one) and ``tz`` (cron only); InvalidArgument naming what is wrong."""
    if (expr is None) == (every is None):
        raise InvalidArgument(
            "give a task either a cron expression or every=SECONDS, "
            f"got {'both' if every is not None else 'neither'}"
        )
    if every is not None:
        if tz is not None:
            raise InvalidArgument(
                f"tz={tz!r} has no meaning for every=: intervals count from the Unix epoch"
            )
        return IntervalSchedule(every)
    assert expr is not None
    return CronSchedule(expr, tz)
