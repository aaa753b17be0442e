"""Interval schedules (``@scheduler.every(seconds=30)``): fire times every
N seconds, aligned to the Unix epoch.

Every instance must compute the same occurrences for the claims to meet, so an
occurrence is not "N seconds after this instance started" (each would have its
own) but a whole multiple of the interval since 1970-01-01 00:00:00 UTC:
``every(minutes=15)`` fires at :00, :15, :30 and :45 of every hour,
``every(hours=1)`` on the hour (UTC), ``every(seconds=45)`` at multiples of
45 s since the epoch. An interval that does not divide a day evenly drifts
across days against the wall clock; use a cron expression where the wall
clock matters.
"""

from __future__ import annotations

import math
from zoneinfo import ZoneInfo

from ..errors import InvalidArgument

__all__ = ("IntervalSchedule", "interval_seconds")

_UTC = ZoneInfo("UTC")


def interval_seconds(seconds: float = 0, minutes: float = 0, hours: float = 0) -> float:
    """The interval of ``every(...)`` in seconds; InvalidArgument unless each
    part is a finite number, not negative, and the sum positive."""
    for what, value in (("seconds", seconds), ("minutes", minutes), ("hours", hours)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidArgument(f"every({what}=...) must be a number, got {value!r}")
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise InvalidArgument(
                f"every({what}=...) must be finite and not negative, got {value!r}"
            )
    total = float(seconds) + 60.0 * minutes + 3600.0 * hours
    if total <= 0:
        raise InvalidArgument(
            "every(...) needs a positive interval: seconds=, minutes= or hours=, "
            f"got {total:g} s in all"
        )
    return total


class IntervalSchedule:
    """Fire times at whole multiples of ``seconds`` since the Unix epoch."""

    __slots__ = ("expr", "seconds", "tz")

    def __init__(self, seconds: float) -> None:
        self.seconds = interval_seconds(seconds)
        self.expr = f"every {_shown(self.seconds)}"
        self.tz = _UTC

    def next_after(self, t: float) -> float:
        return self._after(t) * self.seconds

    def latest_at_or_before(self, t: float) -> float:
        return (self._after(t) - 1) * self.seconds

    def _after(self, t: float) -> int:
        """The index of the first multiple strictly after ``t``."""
        n = math.floor(t / self.seconds) + 1
        # The division rounds: step to the exact index.
        while n * self.seconds <= t:
            n += 1
        while (n - 1) * self.seconds > t:
            n -= 1
        return n

    def __repr__(self) -> str:
        return f"IntervalSchedule({self.seconds!r})"


def _shown(seconds: float) -> str:
    """``30s``, ``15m``, ``1h30m``, ``0.5s``: the interval as written."""
    if seconds != int(seconds) or seconds < 60:
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{secs}s" if secs else "",
    ]
    return "".join(parts)
