"""The memory store: leases in a dict, for one process.

``memory://NAME`` gives every service in the process that names the same
store the same leases (``memory://`` alone is the store named ``default``).
Nothing crosses a process boundary and nothing survives the process: use it
for tests and for code that only needs exclusivity between the tasks and
threads of one program. Expiry uses ``time.monotonic()``; fencing tokens
strictly increase per name for the life of the process.

It is thread-safe: one mutex guards the data, and waiters on any thread's
event loop are woken through that loop's ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from .._aio import settle, woken_within
from ..errors import ConfigurationError
from .audit import FORCED_KEEP, ForcedRelease, newest
from .base import BlockingLeases, Grant, LeaseInfo, RenewItem, Store, evict
from .runlog import RunLog, RunOutcome, RunRecord
from .semaphores import Ledger, Permits, Queued, SemaphoreState, wake_local

__all__ = ("MemoryStore",)


@dataclass(slots=True)
class _Lease:
    token: str
    holder: str
    fence: int
    expires: float
    acquired: float = 0.0


_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class MemoryStore(Store):
    """Leases in this process's memory. See the module docstring."""

    scheme: ClassVar[str] = "memory"

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_guard: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "default") -> None:
        self.name = name
        self._mutex = threading.Lock()
        self._leases: dict[str, _Lease] = {}
        self._fences: dict[str, int] = {}
        self._waiters: dict[str, list[_Waiter]] = {}
        self._claims: dict[str, tuple[float, str]] = {}
        self._runs: dict[str, dict[str, RunRecord]] = {}
        """Run records by task, then run id: a record's keep-the-last-N looks at its task's only."""
        self._plain = _PlainCalls(self)
        self._runlog = _MemoryRunLog(self)
        self._semaphores = _MemoryPermits(self)

    @property
    def runlog(self) -> RunLog:
        return self._runlog

    @property
    def semaphores(self) -> Permits:
        return self._semaphores

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        """The process-wide store called ``name``, created on first use."""
        with cls._named_guard:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(name)
            return store

    @classmethod
    def from_url(cls, url: str) -> MemoryStore:
        parts = urlsplit(url)
        if parts.query or parts.path not in ("", "/"):
            raise ConfigurationError(
                f"memory store URL {url!r} takes only a name: 'memory://' or 'memory://NAME'"
            )
        return cls.named(parts.netloc or "default")

    def describe(self) -> str:
        return f"memory://{self.name}"

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        return self._plain.acquire(name, token, ttl, holder)

    def blocking(self) -> BlockingLeases:
        return self._plain

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        now = time.monotonic()
        results: list[bool] = []
        with self._mutex:
            for item in batch:
                lease = self._leases.get(item.name)
                ok = lease is not None and lease.token == item.token and lease.expires > now
                if ok:
                    assert lease is not None
                    lease.expires = now + item.ttl
                results.append(ok)
        return results

    async def release(self, name: str, token: str) -> bool:
        return self._plain.release(name, token)

    async def force_release(self, name: str) -> LeaseInfo | None:
        return await evict(name, self._live_grant, self.release, self._bump_fence)

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        now = time.monotonic()
        with self._mutex:
            lease = self._leases.get(name)
            if lease is None or lease.expires <= now:
                return None
            return lease.token, LeaseInfo(
                name, lease.holder, lease.fence, lease.expires - now, lease.acquired
            )

    async def _bump_fence(self, name: str) -> None:
        with self._mutex:
            self._fences[name] = self._fences.get(name, 0) + 1

    async def wait_released(self, name: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry: _Waiter = (loop, future)
        with self._mutex:
            lease = self._leases.get(name)
            if lease is None:
                return
            timeout = min(timeout, max(0.0, lease.expires - time.monotonic()))
            self._waiters.setdefault(name, []).append(entry)
        try:
            await woken_within(future, timeout)
        finally:
            with self._mutex:
                waiting = self._waiters.get(name)
                if waiting is not None and entry in waiting:
                    waiting.remove(entry)
                    if not waiting:
                        del self._waiters[name]

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        now = time.monotonic()
        with self._mutex:
            return [
                LeaseInfo(name, lease.holder, lease.fence, lease.expires - now, lease.acquired)
                for name, lease in sorted(self._leases.items())
                if name.startswith(prefix) and lease.expires > now
            ]

    async def prune(self, *, keep_runs: int) -> int:
        now = time.monotonic()
        removed = 0
        with self._mutex:
            # Fencing counters live apart from the leases, so dropping an
            # expired lease never resets one.
            for name in [n for n, lease in self._leases.items() if lease.expires <= now]:
                del self._leases[name]
                removed += 1
            for runs in self._runs.values():
                removed += _keep_latest(runs, keep_runs)
        return removed


class _PlainCalls(BlockingLeases):
    """Acquire and release: plain calls under the store's mutex, which its
    coroutines make too (they never suspend)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        store = self.store
        now = time.monotonic()
        with store._mutex:
            lease = store._leases.get(name)
            if lease is not None and lease.expires > now:
                if lease.token != token:
                    return None
                lease.expires = now + ttl  # resent after its answer was lost: still its own
                return Grant(lease.fence)
            fence = store._fences.get(name, 0) + 1
            store._fences[name] = fence
            store._leases[name] = _Lease(token, holder, fence, now + ttl, time.time())
        return Grant(fence)

    def release(self, name: str, token: str) -> bool:
        store = self.store
        now = time.monotonic()
        with store._mutex:
            lease = store._leases.get(name)
            if lease is None or lease.token != token:
                return False
            del store._leases[name]
            waiters = store._waiters.pop(name, [])
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(settle, future)
            except RuntimeError:  # that waiter's loop has closed
                pass
        return lease.expires > now


class _MemoryPermits(Permits):
    """Semaphores as ledgers in a dict, under the store's mutex."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._ledgers: dict[str, Ledger] = {}
        self.data_key = store.describe()

    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        with self._store._mutex:
            ledger = self._ledgers.setdefault(name, Ledger())
            return ledger.acquire(
                name, token, ttl, holder, limit, queue=queue, now=time.monotonic()
            )

    async def release(self, name: str, token: str) -> bool:
        with self._store._mutex:
            ledger = self._ledgers.get(name)
            released = ledger is not None and ledger.release(token, time.monotonic())
        wake_local(self.data_key, name)
        return released

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        now = time.monotonic()
        with self._store._mutex:
            return [
                (ledger := self._ledgers.get(item.name)) is not None
                and ledger.renew(item.token, item.ttl, now)
                for item in batch
            ]

    async def state(self, name: str) -> SemaphoreState:
        with self._store._mutex:
            return self._ledgers.get(name, Ledger()).state(name, time.monotonic(), 1.0)


class _MemoryRunLog(RunLog):
    """Claims and run records in the store's dicts, under its mutex."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._forced: list[ForcedRelease] = []
        self._board: dict[str, dict[str, str]] = {}

    @property
    def leases(self) -> MemoryStore:
        return self._store

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        store = self._store
        with store._mutex:
            last = store._claims.get(task)
            if last is not None and last[0] >= fire_time:
                return last == (fire_time, claimant)
            store._claims[task] = (fire_time, claimant)
            return True

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        store = self._store
        with store._mutex:
            lasts = [store._claims.get(task) for task, _ in occurrences]
        return [
            last is not None and last[0] >= fire
            for last, (_, fire) in zip(lasts, occurrences, strict=True)
        ]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        store = self._store
        with store._mutex:
            for record in records:
                runs = store._runs.setdefault(record.task, {})
                runs[record.run_id] = record
                _keep_latest(runs, keep)

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        store = self._store
        with store._mutex:
            if task is None:
                chosen = [r for runs in store._runs.values() for r in runs.values()]
            else:
                chosen = list(store._runs.get(task, {}).values())
        chosen.sort(key=lambda r: r.started, reverse=True)
        return chosen[:limit]

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        store = self._store
        written = 0
        with store._mutex:
            for record in records:
                runs = store._runs.get(record.task, {})
                stored = runs.get(record.run_id)
                if stored is not None and stored.outcome == RunOutcome.RUNNING:
                    runs[record.run_id] = record
                    written += 1
        return written

    async def record_forced(self, record: ForcedRelease) -> None:
        with self._store._mutex:
            self._forced.append(record)
            self._forced[:] = newest(self._forced, None, FORCED_KEEP)

    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        with self._store._mutex:
            return newest(self._forced, name, limit)

    async def board(self, kind: str) -> dict[str, str]:
        with self._store._mutex:
            return dict(self._board.get(kind, {}))

    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        with self._store._mutex:
            entries = self._board.setdefault(kind, {})
            if entries.get(key) != expect:
                return False
            if value is None:
                entries.pop(key, None)
            else:
                entries[key] = value
            return True

    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        with self._store._mutex:
            self._board.setdefault(kind, {}).update(values)


def _keep_latest(runs: dict[str, RunRecord], keep: int) -> int:
    """Drop all but the ``keep`` latest started of one task's runs; how many went."""
    if len(runs) <= keep:
        return 0
    ordered = sorted(runs.values(), key=lambda r: r.started, reverse=True)
    for old in ordered[keep:]:
        del runs[old.run_id]
    return len(ordered) - keep
