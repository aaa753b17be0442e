"""How etcd locks ride on etcd leases: shared leases, acquire transactions, renewal.

* **Acquire** is one transaction guarded on ``P/lock/N`` not existing; both
  keys are attached to an etcd lease. Its revision is the fencing token:
  strictly increasing, cluster-wide, and durable. A batch of one TTL is one
  transaction of nested ones. etcd's own v3lock ``Lock`` RPC is not used: it
  is a wait queue that returned without re-checking the lease (Jepsen's etcd
  3.4.3 analysis).
* **Shared leases.** All locks of one store with the same TTL share one etcd
  lease, so one keep-alive renews them all. A lock's lease is renewed on every
  acquire too (sent beside the transaction): the lease then outlives the
  acquire's send time plus the TTL, which is what the holder's local deadline
  assumes. A lease that etcd reports expired marks every lock on it lost.
* **Renewal** is, per lease, a keep-alive and a ``LeaseTimeToLive`` that lists
  the keys still attached to it, sent together: a lock whose token key left its
  lease (released elsewhere, or forced free) is reported lost. A key on the
  lease that no lock of this process owns (an acquire whose answer was lost)
  is deleted, so a shared lease never keeps a stranger alive.
* **TTL granularity.** etcd counts lease TTLs in whole seconds and raises any
  TTL below its minimum (2 s with etcd's defaults): a crashed holder's lock
  frees within that, while its holder gives it up at its own, shorter local
  deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aetcd import rpc

from ...errors import StoreUnavailable
from ..base import AcquireItem, Grant, ReleaseItem, RenewItem
from .keys import Keys, delete, digest, is_, read
from .transport import Transport
from .waiting import Waiting

__all__ = ("Grants", "Lease", "Shared")


@dataclass
class Lease:
    id: int
    valid_until: float
    """Monotonic time before which etcd surely still has it (from the send
    time of the last confirmed grant or keep-alive)."""


@dataclass
class Shared:
    """What a store and its siblings (other threads' loops) share."""

    guard: threading.Lock = field(default_factory=threading.Lock)
    pid: int = field(default_factory=os.getpid)
    leases: dict[float, Lease] = field(default_factory=dict)
    owned: dict[str, tuple[str, int]] = field(default_factory=dict)
    """token -> (name, lease id): registered before the acquire is sent."""
    permits: dict[str, tuple[str, int]] = field(default_factory=dict)
    """The same for semaphore permits and queue entries (``semaphores``)."""


class Grants:
    """The locks of one store on its shared etcd leases (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        keys: Keys,
        shared: Shared,
        waiting: Waiting,
        release_many: Callable[[Sequence[ReleaseItem]], Awaitable[list[bool]]],
    ) -> None:
        self.transport = transport
        self.keys = keys
        self.shared = shared
        self.waiting = waiting
        self.release_many = release_many

    async def lease_for(self, ttl: float) -> Lease:
        """The shared etcd lease for ``ttl``, granted when there is none yet."""
        with self.shared.guard:
            lease = self.shared.leases.get(ttl)
        # A lease past its known lifetime may be gone; a fresh one costs a
        # round trip only then.
        if lease is not None and lease.valid_until > time.monotonic():
            return lease
        sent = time.monotonic()
        answer = await self.transport.call(
            "LeaseGrant", "lease", rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))
        )
        if answer.error:
            raise StoreUnavailable(f"{self.transport.where} refused a lease: {answer.error}")
        # etcd grants at least the TTL asked for, in whole seconds.
        lease = Lease(int(answer.ID), sent + int(answer.TTL))
        with self.shared.guard:
            self.shared.leases[ttl] = lease
        return lease

    def disown(self, token: str) -> None:
        """Stop counting ``token`` as held or being acquired here (``_sweep`` may take its keys)."""
        with self.shared.guard:
            self.shared.owned.pop(token, None)

    def forget_lease(self, lease_id: int) -> None:
        with self.shared.guard:
            for ttl, known in list(self.shared.leases.items()):
                if known.id == lease_id:
                    del self.shared.leases[ttl]

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        groups: dict[float, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(item.ttl, []).append(i)
        answers = await asyncio.gather(
            *(self._acquire_together([items[i] for i in group]) for group in groups.values())
        )
        grants: list[Grant | None] = [None] * len(items)
        for group, answer in zip(groups.values(), answers, strict=True):
            for i, grant in zip(group, answer, strict=True):
                grants[i] = grant
        return grants

    def _acquire_txn(self, item: AcquireItem, lease_id: int) -> Any:
        lock_key = self.keys.lock(item.name)
        token_key = self.keys.token(item.name)
        value = json.dumps({"holder": item.holder, "at": time.time()}).encode()
        return rpc.RequestOp(
            request_txn=rpc.TxnRequest(
                compare=[is_(lock_key, "CREATE", create_revision=0)],
                success=[
                    rpc.RequestOp(
                        request_put=rpc.PutRequest(key=lock_key, value=value, lease=lease_id)
                    ),
                    rpc.RequestOp(
                        request_put=rpc.PutRequest(
                            key=token_key, value=digest(item.token), lease=lease_id
                        )
                    ),
                ],
                # Held: by whom? (Ourselves, when this is a resend of an
                # acquire that was applied but whose answer was lost.)
                failure=[read(lock_key), read(token_key)],
            )
        )

    async def _acquire_together(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        """Acquires of one TTL (distinct names) in one transaction, on one shared lease."""
        ttl = items[0].ttl
        for _attempt in (1, 2):
            lease = await self.lease_for(ttl)
            with self.shared.guard:
                for item in items:
                    self.shared.owned[item.token] = (item.name, lease.id)
            txn = rpc.TxnRequest(success=[self._acquire_txn(item, lease.id) for item in items])
            sent = time.monotonic()
            # The keep-alive travels beside the transaction: granted, the lease
            # then outlives sent + TTL, as the holder's local deadline assumes.
            answers = await asyncio.gather(
                self.transport.call("Txn", "kv", txn),
                self.transport.keep_alive(lease.id),
                return_exceptions=True,
            )
            answer, alive = answers
            if isinstance(answer, BaseException):
                for item in items:
                    self.disown(item.token)
                if isinstance(answer, StoreUnavailable) and "lease not found" in str(answer):
                    self.forget_lease(lease.id)
                    continue
                raise answer
            grants = self._granted(items, answer)
            if isinstance(alive, BaseException) or alive <= 0:
                if not isinstance(alive, BaseException):
                    self.forget_lease(lease.id)  # expired under us: the keys went with it
                    for item in items:
                        self.disown(item.token)
                    continue
                # Granted, but the lease may run out before sent + TTL: give the
                # grants back rather than hand out locks that could lapse early.
                with contextlib.suppress(StoreUnavailable):
                    await self.release_many(
                        [
                            ReleaseItem(i.name, i.token)
                            for i, g in zip(items, grants, strict=True)
                            if g
                        ]
                    )
                raise alive
            lease.valid_until = max(lease.valid_until, sent + alive)
            granted = {
                item.name: item.token for item, grant in zip(items, grants, strict=True) if grant
            }
            with self.shared.guard:
                # Any older token of ours for these names is lost: its key was gone.
                for other, (other_name, _) in list(self.shared.owned.items()):
                    if granted.get(other_name, other) != other:
                        del self.shared.owned[other]
            return grants
        raise StoreUnavailable(f"{self.transport.where} expired two leases in a row")

    def _granted(self, items: Sequence[AcquireItem], answer: Any) -> list[Grant | None]:
        """Each acquire's answer from its nested transaction's."""
        revision = int(answer.header.revision)
        grants: list[Grant | None] = []
        for item, response in zip(items, answer.responses, strict=True):
            inner = response.response_txn
            if inner.succeeded:
                grants.append(Grant(revision))
                continue
            held_by = inner.responses[1].response_range.kvs
            if held_by and held_by[0].value == digest(item.token):
                grants.append(Grant(int(inner.responses[0].response_range.kvs[0].create_revision)))
                continue
            self.disown(item.token)
            self.waiting.saw_held(item.name, revision)
            grants.append(None)
        return grants

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        return await self.renew_owned(
            batch, self.shared.owned, lambda item: self.keys.token(item.name)
        )

    async def renew_owned(
        self,
        batch: Sequence[RenewItem],
        owned: dict[str, tuple[str, int]],
        key_of: Callable[[RenewItem], bytes],
    ) -> list[bool]:
        """Renew the leases that ``batch``'s tokens are on (``owned``: token ->
        (name, lease id)); an item is still held while ``key_of(item)`` is
        attached to its lease."""
        with self.shared.guard:
            where = [owned.get(item.token) for item in batch]
            leases = {lease.id: lease for lease in self.shared.leases.values()}
        lease_ids = sorted({entry[1] for entry in where if entry is not None})
        sent = time.monotonic()
        calls = []
        for lease_id in lease_ids:
            calls.append(self.transport.keep_alive(lease_id))
            calls.append(
                self.transport.call(
                    "LeaseTimeToLive",
                    "lease",
                    rpc.LeaseTimeToLiveRequest(ID=lease_id, keys=True),
                )
            )
        answers: list[Any] = await asyncio.gather(*calls)
        alive: dict[int, set[bytes]] = {}
        for i, lease_id in enumerate(lease_ids):
            ttl, info = answers[2 * i], answers[2 * i + 1]
            if ttl > 0 and info.TTL >= 0:  # TTL counts whole seconds left: 0 is alive
                alive[lease_id] = set(info.keys)
                if lease_id in leases:
                    leases[lease_id].valid_until = max(leases[lease_id].valid_until, sent + ttl)
            else:
                self.forget_lease(lease_id)
        results = []
        for item, entry in zip(batch, where, strict=True):
            keys = alive.get(entry[1]) if entry is not None else None
            ok = keys is not None and key_of(item) in keys
            if not ok:  # lost for good: the holder is told, and nothing renews it again
                with self.shared.guard:
                    owned.pop(item.token, None)
            results.append(ok)
        await self._sweep(alive)
        return results

    async def _sweep(self, alive: dict[int, set[bytes]]) -> None:
        """Delete keys on our leases that no lock of ours owns (an acquire whose
        answer was lost): a shared lease must not keep them alive."""
        with self.shared.guard:
            # Any name this process holds or is acquiring stays, whatever its lease.
            mine = {name for name, _ in self.shared.owned.values()}
            permits = {
                self.keys.permit(name, token) for token, (name, _) in self.shared.permits.items()
            }
        ops = []
        for lease_id, keys in alive.items():
            for key in keys:
                if key.startswith(self.keys.sems) and key not in permits:
                    ops.append((key, lease_id))
                for prefix in (self.keys.tokens, self.keys.locks):
                    if key.startswith(prefix):
                        name = key[len(prefix) :].decode()
                        if name not in mine:
                            ops.append((key, lease_id))
        for key, lease_id in ops:  # rare: one guarded delete each
            await self.transport.call(
                "Txn",
                "kv",
                rpc.TxnRequest(
                    compare=[is_(key, "LEASE", lease=lease_id)],
                    success=[delete(key)],
                ),
            )
