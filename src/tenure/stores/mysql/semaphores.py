"""The MySQL/MariaDB store's semaphores: one row per semaphore, its ledger as JSON.

Each call is one transaction: the semaphore's row is read ``FOR UPDATE``
with the server's clock (microseconds since the epoch, UTC), the rules of
``tenure.stores.semaphores`` (``Ledger``) are applied in Python, and the row
is written back. The row lock makes concurrent calls take turns, so every
call is one atomic step; a semaphore seen for the first time is inserted
(an upsert that changes nothing when it exists, then read locked as any
other). A row is never deleted, so a semaphore's fencing counter never goes
back.

MySQL has no LISTEN/NOTIFY: a waiter reads the row (``_Polled``) and calls
again only when the row says it could be granted, every ``POLL`` seconds
while one release could reach it and less often the farther back it stands;
a release made in this process makes the waiters it may have reached read
at once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from .._waiters import QUEUE_LIFE
from ..base import Grant, RenewItem
from ..semaphores import (
    Changes,
    Ledger,
    Permits,
    Queued,
    SemaphoreState,
    Turns,
    local_changes,
    wake_local,
)
from .schema import Names
from .transport import Transport
from .waiting import POLL

__all__ = ("MySQLPermits",)

T = TypeVar("T")

_US = 1e6
_NOW = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"


class MySQLPermits(Permits):
    """``store.semaphores`` of a MySQL/MariaDB store."""

    def __init__(self, transport: Transport, names: Names, data_key: str) -> None:
        self.transport = transport
        self.data_key = data_key
        # (Not INSERT IGNORE: its warning costs a SHOW WARNINGS round trip in aiomysql.)
        self._insert = (
            f"INSERT INTO {names.semaphores} (name, ledger) VALUES (%s, %s)"
            " ON DUPLICATE KEY UPDATE name = name"
        )
        self._read = f"SELECT ledger, {_NOW} FROM {names.semaphores} WHERE name = %s FOR UPDATE"
        self._peek = f"SELECT ledger, {_NOW} FROM {names.semaphores} WHERE name = %s"
        self._write = f"UPDATE {names.semaphores} SET ledger = %s WHERE name = %s"

    async def _change(self, name: str, change: Callable[[Ledger, int], T], *, create: bool) -> T:
        """``change(ledger, now µs)`` on ``name``'s ledger, written back, in one transaction."""

        async def work(cur: Any) -> T:
            await cur.execute(self._read, (name,))
            row = await cur.fetchone()
            if row is None and create:
                await cur.execute(self._insert, (name, json.dumps(Ledger().dump())))
                await cur.execute(self._read, (name,))
                row = await cur.fetchone()
            if row is None:
                return change(Ledger(), 0)
            ledger = Ledger.load(json.loads(row[0]))
            answer = change(ledger, int(row[1]))
            after = json.dumps(ledger.dump())
            if after != row[0]:
                await cur.execute(self._write, (after, name))
            return answer

        return await self.transport.in_transaction(work)

    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        return await self._change(
            name,
            lambda ledger, now: ledger.acquire(
                name, token, ttl * _US, holder, limit, queue=queue * _US, now=now
            ),
            create=True,
        )

    async def release(self, name: str, token: str) -> bool:
        released = await self._change(
            name, lambda ledger, now: ledger.release(token, now), create=False
        )
        wake_local(self.data_key, name)
        return bool(released)

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        # One transaction per semaphore of the batch: each its own atomic step.
        by_name: dict[str, list[int]] = {}
        for i, item in enumerate(batch):
            by_name.setdefault(item.name, []).append(i)
        answers = [False] * len(batch)
        for name, indices in by_name.items():

            def renew_each(ledger: Ledger, now: int, indices: list[int] = indices) -> list[bool]:
                return [ledger.renew(batch[i].token, batch[i].ttl * _US, now) for i in indices]

            for i, ok in zip(
                indices, await self._change(name, renew_each, create=False), strict=True
            ):
                answers[i] = ok
        return answers

    async def state(self, name: str) -> SemaphoreState:
        rows = await self.transport.query(self._peek, (name,))
        if not rows:
            return SemaphoreState(name, None, [], 0)
        ledger = Ledger.load(json.loads(rows[0][0]))
        return ledger.state(name, int(rows[0][1]), _US)

    @contextlib.asynccontextmanager
    async def changes(self, name: str) -> AsyncIterator[Changes]:
        async with local_changes(self.data_key, name) as local:
            polled = _Polled(self, name, local)
            await polled.look()  # before the acquire it follows: a release after it is seen
            yield polled


class _Polled(Turns):
    """A semaphore's row, read while a waiter waits, and this process's releases.

    A waiter that ``follow``s its token wakes only when the row says it could
    be granted: the live permits plus the live queue entries ahead of it are
    fewer than the limit (the rule its next acquire applies). It reads the row
    every ``POLL`` seconds while one release could reach it, less often the
    farther back it stands (one ``POLL`` per release it needs, at most a third
    of ``QUEUE_LIFE``: it calls then anyway), and at once after a release in
    this process when that release may have been the one it needed. So a
    release costs the one waiter it reaches an acquire, not every waiter.
    Without a token, any change of the row wakes it.
    """

    polls = True

    def __init__(self, permits: MySQLPermits, name: str, local: Changes) -> None:
        super().__init__()
        self.permits = permits
        self.name = name
        self.local = local
        self.seen: str | None = None

    def slice(self, left: float) -> float:
        return min(left, POLL * max(self.needs, 1), QUEUE_LIFE / 3)

    async def heard(self, timeout: float) -> bool:
        return await self.local.wait(timeout)

    async def look(self) -> bool:
        """Read the row: whether this waiter could be granted now (without a
        token: whether a permit may have freed since the last look)."""
        rows = await self.permits.transport.query(self.permits._peek, (self.name,))
        ledger, now = (rows[0][0], int(rows[0][1])) if rows else (None, 0)
        if self.token is not None:
            if ledger is None:
                return True
            # (A permit held already is an answer lost on its way: 0 too.)
            self.needs = Ledger.load(json.loads(ledger)).needs(self.token, now)
            return self.needs <= 0
        changed = ledger != self.seen
        self.seen = ledger
        if ledger is not None and not changed:
            permits = json.loads(ledger)[2]
            changed = any(permit[1] <= now for permit in permits.values())
        return changed
