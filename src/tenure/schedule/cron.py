"""Cron expressions to fire times, through croniter (parsing, ranges, DST).

Five fields (minute hour day month weekday), or six with *seconds first*
(``*/10 * * * * *`` is every ten seconds). Fire times are POSIX seconds; a
time zone (a ``zoneinfo`` name, UTC by default) decides what wall-clock
fields mean, and croniter decides what happens to times that a DST change
skips or repeats.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

from ..errors import InvalidArgument

__all__ = ("CronSchedule",)

_NEXT: dict[tuple[str, str, float], float] = {}
"""Fire times computed lately, by (expression, zone, after): plain dict reads
and writes, which the GIL keeps whole across threads."""
_NEXT_MAX = 4096


class CronSchedule:
    """A validated cron expression in a time zone."""

    __slots__ = ("_guard", "_iter", "expr", "seconds_field", "tz")

    def __init__(self, expr: str, tz: str | None = None) -> None:
        if not isinstance(expr, str):
            raise InvalidArgument(f"a cron expression must be a str, got {expr!r}")
        fields = expr.split()
        if len(fields) not in (5, 6):
            raise InvalidArgument(
                f"cron expression {expr!r} has {len(fields)} fields; write 5 (minute hour day "
                "month weekday) or 6 with seconds first"
            )
        self.seconds_field = len(fields) == 6
        if not croniter.is_valid(expr, second_at_beginning=self.seconds_field):
            raise InvalidArgument(f"cron expression {expr!r} is not valid")
        self.expr = " ".join(fields)
        if tz is None:
            self.tz = ZoneInfo("UTC")
        else:
            if not isinstance(tz, str) or not tz:
                raise InvalidArgument(f"a time zone must be a zoneinfo name, got {tz!r}")
            try:
                self.tz = ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise InvalidArgument(
                    f"unknown time zone {tz!r}; use an IANA name such as 'Europe/Berlin'"
                ) from exc
        # One parsed expression, moved to each start time: parsing it again for
        # every fire time would cost five times as much (a thousand tasks
        # firing every second compute a thousand fire times a second).
        start = datetime(2000, 1, 1, tzinfo=self.tz)
        self._iter = croniter(self.expr, start, second_at_beginning=self.seconds_field)
        self._guard = threading.Lock()
        # One computation now, so that an expression that never fires (30 February)
        # fails at registration, not at the first tick.
        self.next_after(datetime(2000, 1, 1, tzinfo=UTC).timestamp())

    def next_after(self, t: float) -> float:
        """The first fire time strictly after ``t`` (POSIX seconds)."""
        # Tasks that share an expression and zone (a cron table's many
        # "0 * * * *") share the answer: computed once per tick, not per task.
        key = (self.expr, self.tz.key, t)
        found = _NEXT.get(key)
        if found is None:
            found = self._next_after(t)
            if len(_NEXT) >= _NEXT_MAX:
                _NEXT.clear()
            _NEXT[key] = found
        return found

    def _next_after(self, t: float) -> float:
        start = datetime.fromtimestamp(t, self.tz)
        try:
            with self._guard:
                self._iter.set_current(start, force=True)
                return float(self._iter.get_next(float))
        except (CroniterBadCronError, CroniterBadDateError) as exc:
            raise InvalidArgument(f"cron expression {self.expr!r} never fires: {exc}") from exc

    def latest_at_or_before(self, t: float) -> float:
        """The last fire time at or before ``t``."""
        start = datetime.fromtimestamp(t, self.tz)
        with self._guard:
            self._iter.set_current(start, force=True)
            before = float(self._iter.get_prev(float))
        after = self.next_after(before)
        return after if after <= t else before

    def __repr__(self) -> str:
        return f"CronSchedule({self.expr!r}, tz={str(self.tz)!r})"
