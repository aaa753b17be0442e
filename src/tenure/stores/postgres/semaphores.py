"""The PostgreSQL store's semaphores: a row per semaphore, slot rows for its permits.

The acquire is one call of the function ``<prefix>_sem_acquire`` (see
``schema.SEMAPHORES``), which applies the rules of
``tenure.stores.semaphores`` under the semaphore row's lock; release and a
renewal batch are one statement each. Expiry is the server's clock; fencing
tokens come from the store's one sequence, as locks' do, so they never repeat.
A release that finds waiters queued NOTIFYs the store's channel with a note
naming the semaphore, which they hear on the store's one LISTEN connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from ...errors import LimitMismatch
from ..base import Grant, LeaseInfo, RenewItem
from ..semaphores import Changes, Permits, Queued, SemaphoreState, wake_local
from .listen import Waiting
from .schema import Names
from .transport import Transport

__all__ = ("NOTE", "PostgresPermits")

NOTE = "\x1fsem\x1f"
"""What a semaphore's release note starts with (no lock name can)."""


class PostgresPermits(Permits):
    """``store.semaphores`` of a PostgreSQL store."""

    def __init__(self, transport: Transport, waiting: Waiting, data_key: str) -> None:
        self.transport = transport
        self.waiting = waiting
        self.data_key = data_key
        names: Names = transport.sql.names
        self._acquire = names.render("SELECT code, val FROM {sem_acquire}(%s, %s, %s, %s, %s, %s)")
        self._release = names.render(
            "WITH gone AS (UPDATE {permits} SET token = NULL"
            " WHERE name = %(name)s AND token = %(token)s"
            " RETURNING expires > clock_timestamp() AS live),"
            " withdrawn AS (DELETE FROM {sem_queue} WHERE name = %(name)s AND token = %(token)s) "
            "SELECT coalesce((SELECT bool_or(live) FROM gone), false),"
            # Only when someone waits: a NOTIFY costs every commit a queue lock.
            " CASE WHEN EXISTS (SELECT 1 FROM {sem_queue} WHERE name = %(name)s"
            " AND token <> %(token)s AND until > clock_timestamp())"
            " THEN pg_notify({channel_literal}, {sem_note} || %(name)s) END"
        )
        self._renew = names.render(
            "UPDATE {permits} AS p SET expires = clock_timestamp() + make_interval(secs => b.ttl) "
            "FROM unnest(%s::text[], %s::text[], %s::float8[]) WITH ORDINALITY"
            " AS b(name, token, ttl, i) "
            "WHERE p.name = b.name AND p.token = b.token AND p.expires > clock_timestamp() "
            "RETURNING b.i"
        )
        self._state = names.render(
            "SELECT s.lim, (SELECT count(*) FROM {sem_queue} AS q"
            " WHERE q.name = s.name AND q.until > clock_timestamp()),"
            " p.holder, p.fence, extract(epoch FROM p.expires - clock_timestamp())::float8,"
            " extract(epoch FROM p.acquired)::float8 "
            "FROM {semaphores} AS s LEFT JOIN {permits} AS p ON p.name = s.name"
            " AND p.token IS NOT NULL AND p.expires > clock_timestamp() "
            "WHERE s.name = %s"
        )

    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        rows = await self.transport.query(self._acquire, (name, token, holder, ttl, limit, queue))
        code, value = rows[0]
        if code == 1:
            return Grant(value)
        if code == 2:
            return Queued(value)
        if code == -1:
            raise LimitMismatch(name, value, limit)
        return None

    async def release(self, name: str, token: str) -> bool:
        rows = await self.transport.query(self._release, {"name": name, "token": token})
        wake_local(self.data_key, NOTE + name)
        return bool(rows and rows[0][0])

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        rows = await self.transport.query(
            self._renew,
            (
                [item.name for item in batch],
                [item.token for item in batch],
                [item.ttl for item in batch],
            ),
        )
        extended = {row[0] for row in rows}
        return [i + 1 in extended for i in range(len(batch))]

    async def state(self, name: str) -> SemaphoreState:
        rows = await self.transport.query(self._state, (name,))
        permits = sorted(
            (
                LeaseInfo(name, holder, fence, expires_in, acquired)
                for _, _, holder, fence, expires_in, acquired in rows
                if fence is not None
            ),
            key=lambda info: info.fencing_token,
        )
        waiting = int(rows[0][1]) if rows else 0
        if not permits and not waiting:
            return SemaphoreState(name, None, [], 0)
        return SemaphoreState(name, rows[0][0], permits, waiting)

    def changes(self, name: str) -> contextlib.AbstractAsyncContextManager[Changes]:
        return self.waiting.notes(NOTE + name, self.data_key)
