"""Waiting for an etcd lease: one watch per connection on every lock key's deletion.

Waiters watch ``P/lock/N`` for its deletion from the revision at which they
saw it held, so a release between that look and the watch is not missed; a
lease expiry deletes the key too. One watch per connection serves every
waiter of that event loop, dispatched by name.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc
from aetcd.exceptions import RevisionCompactedError
from aetcd.rtypes import Event, EventKind

from ..._aio import woken_within
from .._waiters import Wakeups
from .keys import Keys, prefix_end

if TYPE_CHECKING:
    from .transport import Conn, Transport

__all__ = ("SEEN_MAX", "Releases", "Waiting")

SEEN_MAX = 10_000  # contended names remembered for a wait that may follow


class Releases:
    """One watch per connection on the deletions of every lock key, dispatched
    to this loop's waiters by name (``wait_released``)."""

    def __init__(self) -> None:
        self.wakeups: Wakeups[str] = Wakeups()
        self.watching = False
        self.since = 0
        """The revision the watch started from: every deletion from it on is seen."""
        self.starting: asyncio.Future[None] | None = None
        self.deleted: dict[str, int] = {}
        """Name -> revision of its latest deletion the watch delivered: a waiter
        that registers just after one (it was on its way) still sees it."""
        self.forgot = 0
        """Deletions before this revision may have been dropped from ``deleted``."""

    def on_event(self, prefix_length: int, event: Any) -> None:
        if not isinstance(event, Event):  # the stream's error: everyone looks again
            self.watching = False
            self.wakeups.wake_all()
            return
        name = event.kv.key[prefix_length:].decode()
        revision = int(event.kv.mod_revision)
        if len(self.deleted) >= SEEN_MAX:
            self.deleted.clear()
            self.forgot = revision
        self.deleted[name] = revision
        self.wakeups.wake(name)

    def missed(self, name: str, seen: int | None) -> bool:
        """Whether a deletion of ``name`` after revision ``seen`` may have come
        before its waiter registered (or before the watch began): look again now."""
        if seen is None:
            return False
        return self.since > seen + 1 or seen < self.forgot or self.deleted.get(name, 0) > seen


class Waiting:
    """``wait_released`` of one store (see the module docstring)."""

    def __init__(self, transport: Transport, keys: Keys) -> None:
        self.transport = transport
        self.keys = keys
        self.seen: dict[str, int] = {}
        """Name -> revision at which an acquire of this store saw it held."""

    def saw_held(self, name: str, revision: int) -> None:
        if len(self.seen) >= SEEN_MAX:  # acquires that never waited
            self.seen.clear()
        self.seen[name] = revision

    async def wait_released(self, name: str, timeout: float) -> None:
        seen = self.seen.pop(name, None)
        conn = await self.transport.conn()
        releases = conn.releases
        woken = releases.wakeups.add(name)
        try:
            if not releases.watching:
                if releases.starting is None or releases.starting.done():
                    releases.starting = asyncio.ensure_future(self._watch_releases(conn, seen))
                await asyncio.shield(releases.starting)
            if seen is None:
                # No acquire of ours saw it held (a waiter whose turn came in
                # its process's line): look now that the watch runs, so that a
                # release before it began is not waited for.
                answer = await self.transport.call(
                    "Range", "kv", rpc.RangeRequest(key=self.keys.lock(name))
                )
                if not answer.kvs:
                    return
                seen = int(answer.header.revision)
            if releases.missed(name, seen):
                return
            await woken_within(woken, timeout)
        finally:
            releases.wakeups.remove(name, woken)

    async def _watch_releases(self, conn: Conn, seen: int | None) -> None:
        """Start this connection's one watch on every lock key's deletion, from
        just after ``seen`` (the revision at which the first waiter saw its lock
        held), or from now."""
        releases = conn.releases
        start = self.keys.locks

        async def on_event(event: Any) -> None:  # a deletion, or the stream's error
            releases.on_event(len(start), event)

        if seen is None:
            answer = await self.transport.call("Range", "kv", rpc.RangeRequest(key=start, limit=1))
            seen = int(answer.header.revision)
        try:
            await asyncio.wait_for(
                conn.watcher.add_callback(
                    start,
                    on_event,
                    range_end=prefix_end(start),
                    start_revision=seen + 1,
                    kind=EventKind.DELETE,
                ),
                self.transport.timeout,
            )
        except RevisionCompactedError:  # that revision is gone: from now, and look again
            await self._watch_releases(conn, None)
            return
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            raise self.transport.failed(conn, exc) from exc
        releases.since = seen + 1
        releases.watching = True
