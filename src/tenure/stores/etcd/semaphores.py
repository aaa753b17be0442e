"""The etcd store's semaphores: a key per permit or waiter, ordered by revision.

Every permit and queued waiter of semaphore ``N`` is a key ``P/sem/N\\x1fD``
on one of the store's shared etcd leases (see ``keys``); the semaphore's
limit is ``P/semlimit/N``. A caller is granted while its key is among the
first ``limit`` keys by create revision: keys only ever leave the front of
that order (released, or gone with their lease), so at most ``limit`` keys
can be there, and a key's create revision (its fencing token) is larger than
every earlier permit's. The rules of ``tenure.stores.semaphores`` follow:
the queue is the revision order, an idle semaphore takes the caller's limit.

* **Acquire** is one transaction, guarded on the limit's value: put the
  caller's key, read the semaphore's keys in revision order. A caller that
  may queue puts its key on the short queue lease (``QUEUE_LIFE``, which etcd
  raises to its minimum) and moves it to the TTL's lease once granted, a
  second transaction; one that may not, on the TTL's lease, and deletes it
  again when it was not granted. The lease's keep-alive travels beside, as a
  lock's acquire's does.
* **Release** deletes the caller's key; **renewal** is the locks' (a keep-alive
  and a ``LeaseTimeToLive`` per lease).
* Waiters are woken by the connection's one watch on the deletions under
  ``P/sem/`` (``waiting.watch_deletions``), started before their first
  acquire, so a release or expiry in any process is heard at once; a waiter
  reads the order again (and calls) only once it has heard as many deletions
  as stood between it and a permit (``_Freed``). They call again at least
  every third of a second anyway (their queue entries live on a short lease),
  which also covers the moment a broken watch restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aetcd import rpc

from ..._aio import woken_within
from ...errors import LimitMismatch, StoreUnavailable
from ..base import Grant, LeaseInfo, RenewItem
from ..semaphores import Changes, Permits, Queued, SemaphoreState, Turns
from .grants import Grants
from .keys import Keys, delete, is_, prefix_end, read
from .transport import Conn, Transport
from .waiting import watch_deletions

__all__ = ("EtcdPermits",)

QUEUE_LEASE = 1.0
"""TTL asked for the queue entries' lease (etcd raises it to its minimum)."""


class EtcdPermits(Permits):
    """``store.semaphores`` of an etcd store."""

    def __init__(self, transport: Transport, keys: Keys, grants: Grants) -> None:
        self.transport = transport
        self.keys = keys
        self.grants = grants

    def _own(self, name: str, token: str, lease_id: int) -> None:
        with self.grants.shared.guard:
            self.grants.shared.permits[token] = (name, lease_id)

    def _disown(self, token: str) -> None:
        with self.grants.shared.guard:
            self.grants.shared.permits.pop(token, None)

    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        for _attempt in range(3):
            answer = await self._put(name, token, holder, limit, QUEUE_LEASE if queue else ttl)
            if answer is None:  # the limit was set or changed: look again
                continue
            position, revision = answer
            if position < limit:
                if queue:
                    return await self._promote(name, token, ttl, revision)
                return Grant(revision)
            if not queue:
                await self.release(name, token)
                return None
            return Queued(position - limit)
        raise StoreUnavailable(f"{self.transport.where}: semaphore {name!r} kept changing")

    async def _put(
        self, name: str, token: str, holder: str, limit: int, lease_ttl: float
    ) -> tuple[int, int] | None:
        """Put the caller's key and read the order: (its position, its create
        revision); None when the limit had to be set first."""
        lease = await self.grants.lease_for(lease_ttl)
        key = self.keys.permit(name, token)
        start = self.keys.permits(name)
        self._own(name, token, lease.id)
        value = json.dumps({"holder": holder, "at": time.time()}).encode()
        txn = rpc.TxnRequest(
            compare=[is_(self.keys.limit(name), "VALUE", value=str(limit).encode())],
            success=[
                rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease.id)),
                _in_order(start),
            ],
            failure=[read(self.keys.limit(name))],
        )
        sent = time.monotonic()
        answer, alive = await _together(
            self.transport.call("Txn", "kv", txn), self.transport.keep_alive(lease.id)
        )
        if alive <= 0:
            self.grants.forget_lease(lease.id)
            await self.release(name, token)
            return None
        lease.valid_until = max(lease.valid_until, sent + alive)
        if not answer.succeeded:
            self._disown(token)
            await self._set_limit(name, limit, answer.responses[0].response_range.kvs)
            return None
        order = [kv.key for kv in answer.responses[1].response_range.kvs]
        kvs = answer.responses[1].response_range.kvs
        position = order.index(key)
        return position, int(kvs[position].create_revision)

    async def _set_limit(self, name: str, limit: int, found: Any) -> None:
        """Set the limit of an idle semaphore (no permit, no waiter); raise
        LimitMismatch when it is in use with another."""
        start = self.keys.permits(name)
        seen = int(found[0].mod_revision) if found else 0
        idle = rpc.Compare(
            key=start,
            range_end=prefix_end(start),
            target=rpc.Compare.CREATE,
            result=rpc.Compare.EQUAL,
            create_revision=0,
        )
        answer = await self.transport.call(
            "Txn",
            "kv",
            rpc.TxnRequest(
                compare=[is_(self.keys.limit(name), "MOD", mod_revision=seen), idle],
                success=[
                    rpc.RequestOp(
                        request_put=rpc.PutRequest(
                            key=self.keys.limit(name), value=str(limit).encode()
                        )
                    )
                ],
                failure=[read(self.keys.limit(name))],
            ),
        )
        if answer.succeeded:
            return
        kvs = answer.responses[0].response_range.kvs
        if kvs and int(kvs[0].mod_revision) == seen:  # the same limit, but in use
            raise LimitMismatch(name, int(kvs[0].value), limit)

    async def _promote(self, name: str, token: str, ttl: float, revision: int) -> Grant | None:
        """A queued waiter was granted: move its key to the TTL's lease."""
        lease = await self.grants.lease_for(ttl)
        key = self.keys.permit(name, token)
        self._own(name, token, lease.id)
        txn = rpc.TxnRequest(
            compare=[is_(key, "CREATE", create_revision=revision)],
            success=[
                rpc.RequestOp(
                    request_put=rpc.PutRequest(key=key, ignore_value=True, lease=lease.id)
                )
            ],
        )
        sent = time.monotonic()
        answer, alive = await _together(
            self.transport.call("Txn", "kv", txn), self.transport.keep_alive(lease.id)
        )
        if not answer.succeeded or alive <= 0:  # its queue lease ran out first
            self._disown(token)
            return None
        lease.valid_until = max(lease.valid_until, sent + alive)
        return Grant(revision)

    async def release(self, name: str, token: str) -> bool:
        try:
            answer = await self.transport.call(
                "Txn", "kv", rpc.TxnRequest(success=[delete(self.keys.permit(name, token))])
            )
        finally:
            # Only now, as for locks: a renewal in flight would otherwise take
            # the key for an orphan's and delete it first, and this release
            # would report the permit lost.
            self._disown(token)
        return bool(answer.responses[0].response_delete_range.deleted)

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        return await self.grants.renew_owned(
            batch,
            self.grants.shared.permits,
            lambda item: self.keys.permit(item.name, item.token),
        )

    @contextlib.asynccontextmanager
    async def changes(self, name: str) -> AsyncIterator[Changes]:
        changes = _Freed(self.transport, self.keys, name)
        try:
            # Watching (confirmed) before the first acquire: a release in
            # between is seen.
            await changes.watch()
            yield changes
        finally:
            changes.forget()

    async def state(self, name: str) -> SemaphoreState:
        start = self.keys.permits(name)
        answer = await self.transport.call(
            "Txn",
            "kv",
            rpc.TxnRequest(
                success=[
                    rpc.RequestOp(
                        request_range=rpc.RangeRequest(
                            key=start,
                            range_end=prefix_end(start),
                            sort_target=rpc.RangeRequest.CREATE,
                            sort_order=rpc.RangeRequest.ASCEND,
                        )
                    ),
                    read(self.keys.limit(name)),
                ]
            ),
        )
        kvs = list(answer.responses[0].response_range.kvs)
        limit_kvs = answer.responses[1].response_range.kvs
        if not kvs or not limit_kvs:
            return SemaphoreState(name, None, [], 0)
        limit = int(limit_kvs[0].value)
        permits = []
        for kv in kvs[:limit]:
            info = await self.transport.call(
                "LeaseTimeToLive", "lease", rpc.LeaseTimeToLiveRequest(ID=int(kv.lease))
            )
            value = json.loads(kv.value)
            permits.append(
                LeaseInfo(
                    name, value["holder"], int(kv.create_revision), float(info.TTL), value["at"]
                )
            )
        return SemaphoreState(name, limit, permits, max(0, len(kvs) - limit))


class _Freed(Turns):
    """A semaphore's released or lapsed keys, seen by its connection's watch:
    a waiter counts them against its place in the revision order (``Turns``)."""

    def __init__(self, transport: Transport, keys: Keys, name: str) -> None:
        super().__init__()
        self.transport = transport
        self.keys = keys
        self.start = keys.sems
        self.name = name
        self.conn: Conn | None = None
        self.woken: asyncio.Future[None] | None = None

    async def look(self) -> bool:
        """Whether this waiter's key is among the first ``limit`` by revision
        now (or gone, or the limit with it: then its acquire says what holds)."""
        assert self.token is not None
        order = _in_order(self.keys.permits(self.name))
        answer = await self.transport.call(
            "Txn", "kv", rpc.TxnRequest(success=[order, read(self.keys.limit(self.name))])
        )
        keys = [kv.key for kv in answer.responses[0].response_range.kvs]
        limit = answer.responses[1].response_range.kvs
        mine = self.keys.permit(self.name, self.token)
        if mine not in keys or not limit:
            return True
        self.needs = keys.index(mine) - int(limit[0].value) + 1
        return self.needs <= 0

    async def watch(self) -> None:
        """Wait on the current connection's watch, starting it if need be (on a
        connection that replaced a broken one, too)."""
        conn = await self.transport.conn()
        if conn is not self.conn:
            self.forget()
            self.conn, self.woken = conn, conn.freed.wakeups.add(self.name)
        if not conn.freed.watching:
            self.needs = 1  # deletions made while no watch ran were not counted
        await watch_deletions(self.transport, conn, conn.freed, self.start, None)

    async def heard(self, timeout: float) -> bool:
        with contextlib.suppress(StoreUnavailable):  # the next acquire says so, if it lasts
            await self.watch()
        assert self.conn is not None and self.woken is not None
        try:
            return await woken_within(self.woken, timeout)
        finally:
            if self.woken.done():
                self.woken = self.conn.freed.wakeups.add(self.name, instead_of=self.woken)

    def forget(self) -> None:
        if self.conn is not None and self.woken is not None:
            self.conn.freed.wakeups.remove(self.name, self.woken)


def _in_order(start: bytes) -> Any:
    """A read of a semaphore's keys (permits first, then the queue): their order."""
    return rpc.RequestOp(
        request_range=rpc.RangeRequest(
            key=start,
            range_end=prefix_end(start),
            keys_only=True,
            sort_target=rpc.RangeRequest.CREATE,
            sort_order=rpc.RangeRequest.ASCEND,
        )
    )


async def _together(call: Any, keep_alive: Any) -> tuple[Any, int]:
    """A transaction and its lease's keep-alive, sent together."""
    answer, alive = await asyncio.gather(call, keep_alive)
    return answer, int(alive)
