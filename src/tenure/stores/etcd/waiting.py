"""Waiting on etcd: one watch per connection on the deletions under a prefix.

Lock waiters watch ``P/lock/N`` for its deletion from the revision at which
they saw it held, so a release between that look and the watch is not
missed; a lease expiry deletes the key too. Semaphore waiters watch the
deletions of ``P/sem/N\x1f...`` (a permit released or lapsed, a queue entry
withdrawn) from before their first acquire. One watch per connection and
prefix serves every waiter of that event loop, dispatched by name.
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

__all__ = ("SEEN_MAX", "Releases", "Waiting", "watch_deletions")

SEEN_MAX = 10_000  # contended names remembered for a wait that may follow


class Releases:
    """One watch per connection on the deletions of every key under a prefix
    (a lock's, or a semaphore's permits), dispatched to this loop's waiters
    by name. ``end``: the byte that ends the name within a key, if any."""

    def __init__(self, end: bytes | None = None) -> None:
        self.end = end
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
        key = event.kv.key[prefix_length:]
        if self.end is not None:
            key = key.partition(self.end)[0]
        name = key.decode()
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
            await watch_deletions(self.transport, conn, releases, self.keys.locks, seen)
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


async def watch_deletions(
    transport: Transport, conn: Conn, releases: Releases, start: bytes, seen: int | None
) -> None:
    """Make sure ``conn``'s one watch on the deletions of every key under
    ``start`` runs: when it does not, start it from just after revision
    ``seen`` (at which the first waiter saw what it waits for), or from now.
    Callers arriving while it starts share the start."""
    if releases.watching:
        return
    if releases.starting is None or releases.starting.done():
        releases.starting = asyncio.ensure_future(_watch(transport, conn, releases, start, seen))
    await asyncio.shield(releases.starting)


async def _watch(
    transport: Transport, conn: Conn, releases: Releases, start: bytes, seen: int | None
) -> None:
    async def on_event(event: Any) -> None:  # a deletion, or the stream's error
        releases.on_event(len(start), event)

    if seen is None:
        answer = await transport.call("Range", "kv", rpc.RangeRequest(key=start, limit=1))
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
            transport.timeout,
        )
    except RevisionCompactedError:  # that revision is gone: from now, and look again
        await _watch(transport, conn, releases, start, None)
        return
    except (TimeoutError, grpc.aio.AioRpcError) as exc:
        raise transport.failed(conn, exc) from exc
    releases.since = seen + 1
    releases.watching = True
