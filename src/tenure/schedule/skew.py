"""This instance's clock against the store's: measured at start and every
five minutes, with a warning (and an event) past ``skew_warning``.

Skew never makes an occurrence run twice (claims compare occurrence times, not
clocks), but it moves when each runs: the instance most ahead fires first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..errors import TenureError
from ..events import Event, EventKind
from ..locks import LockService

__all__ = ("SKEW_CHECK", "SKEW_WARNING", "SkewWatch")

log = logging.getLogger("tenure.scheduler")

SKEW_WARNING = 1.0
"""Seconds of clock skew against the store past which the scheduler (and ``tenure
doctor``) warns."""
SKEW_CHECK = 300.0
"""Seconds between two measurements of this instance's clock against the store's."""


class SkewWatch:
    """Measures and judges one scheduler's clock against its store's."""

    def __init__(
        self, locks: LockService, clock: Callable[[], float], warning: float = SKEW_WARNING
    ) -> None:
        self.locks = locks
        self.clock = clock
        self.warning = warning
        self.skew: float | None = None
        """The clock minus the store's, in seconds, as last measured (None
        before the first measurement, or for a store without a clock)."""
        self._said: float | None = None

    async def watch(self) -> None:
        """Measure now and every SKEW_CHECK seconds; warn once past the
        warning, again on change. Returns at once for a store without a clock."""
        while True:
            try:
                before = self.clock()
                theirs = await self.locks.store.server_time()
                after = self.clock()
            except TenureError as exc:
                log.debug("could not read the store's clock: %s", exc)
            else:
                if theirs is None:
                    return  # SQLite, memory, etcd: no clock of the store's to compare
                self.judge((before + after) / 2 - theirs)
            await asyncio.sleep(SKEW_CHECK)

    def judge(self, skew: float) -> None:
        """Take a measurement: warn past the warning, unless that was said
        already for about this skew; say when it is back within."""
        self.skew = skew
        said = self._said
        if abs(skew) > self.warning:
            if said is None or abs(skew - said) > self.warning / 2:
                self._said = skew
                log.warning(
                    "this instance's clock is %.2f s %s the store's: it fires every occurrence "
                    "that much %s. Each still runs once (the first instance to claim it runs "
                    "it), so the instance most ahead runs them early; keep clocks in sync (NTP)",
                    abs(skew),
                    "ahead of" if skew > 0 else "behind",
                    "early" if skew > 0 else "late",
                )
                if self.locks.observed:
                    self.locks.emit(Event(EventKind.SKEW, "", self.locks.holder, seconds=skew))
        elif said is not None:
            self._said = None
            log.info("this instance's clock is back within %.2f s of the store's", self.warning)
