"""Which instances serve now (their presence leases), read in the background
as ticks go, so that ``spread`` knows which tasks this instance claims first."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from ..errors import TenureError
from ..locks import LockService
from ..stores.runlog import live_instances
from ._spread import PEERS_RECHECK, PEERS_REFRESH, Spread

__all__ = ("Peers",)

log = logging.getLogger("tenure.scheduler")


class Peers:
    """The instances this one knows of, and when to read them again."""

    def __init__(self, locks: LockService) -> None:
        self.locks = locks
        self.spread = Spread(locks.holder)
        """Which tasks this instance claims first (see ``_spread``)."""
        self._read_at = -math.inf
        self._first_tick: float | None = None
        self._reading: asyncio.Future[None] | None = None
        """The background read in flight (``read_soon``), if any."""

    async def read(self) -> None:
        """Read which instances serve now, for ``spread``."""
        self._read_at = time.monotonic()
        try:
            self.spread.update(await live_instances(self.locks.store), self.locks.holder)
        except TenureError as exc:
            log.debug("could not read which instances serve: %s", exc)

    def read_soon(self, now: float, every: float = PEERS_REFRESH) -> None:
        """``read`` in the background, unless it was read less than ``every`` seconds ago."""
        if now - self._read_at < every or self._reading is not None:
            return
        self._read_at = now
        reading = self._reading = asyncio.ensure_future(self.read())

        def done(_: object) -> None:
            self._reading = None

        reading.add_done_callback(done)

    def at_tick(self, began: float) -> None:
        """A tick began: read again if due. Instances that start together may
        each miss the others' presence at their first read, so while starting
        they read every second."""
        if self._first_tick is None:
            self._first_tick = began
        starting = began - self._first_tick < PEERS_REFRESH
        self.read_soon(began, PEERS_RECHECK if starting else PEERS_REFRESH)
