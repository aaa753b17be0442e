"""The Redis store: leases as hashes with a server-side expiry (``PEXPIRE``).

URL forms: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS),
``unix:///path/to/redis.sock``, with redis-py's query options
(``socket_timeout``, ``ssl_cert_reqs`` ...) and ours: ``prefix`` (default
``tenure``), ``cluster`` (``true`` for Redis Cluster) and ``pool_max``; and
``redis+sentinel://host:26379,host:26379/service`` for a master that Redis
Sentinel manages (``sentinel``).

* Acquire, release and each renewal batch are one Lua script call each (on
  Redis Cluster a batch is one call per hash slot, sent together). Expiry is
  Redis's own ``PEXPIRE``; no client timestamp is ever compared.
* Fencing tokens never go below the server's ``TIME`` in microseconds, so a
  Redis without persistence that restarts empty still hands out larger ones.
  What such a restart does lose is the leases themselves: a holder keeps
  believing it holds a lock that another client can now acquire, until its
  next renewal finds the token gone. With ``appendonly yes`` and
  ``appendfsync always`` the leases survive a restart.

Where the rest lives: ``scripts`` (keys, Lua, RESP, reply codes),
``transport`` (connections, lanes, retry, errors), ``blocking`` (the plain
calls of ``tenure.sync``), ``waiting`` (release notifications and the
hand-over queue), ``runlog`` (claims and run records), ``operators``
(listings and ``tenure doctor``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import ClassVar
from urllib.parse import urlencode

import redis as redis_sync

from ...errors import ConfigurationError
from .._gate import Gate
from .._options import POOL_MAX, check_pool_max, mask, options
from ..base import (
    AcquireItem,
    Finding,
    Grant,
    HandedOver,
    HandsOver,
    LeaseInfo,
    ReleaseItem,
    RenewItem,
    Store,
    evict,
)
from . import operators, sentinel
from .blocking import BlockingCalls
from .runlog import RedisRunLog
from .scripts import Keys, per_slot
from .semaphores import RedisPermits
from .transport import Transport
from .waiting import Waiting

__all__ = ("RedisStore",)

_CLUSTER_NEEDS = (8, 2)
"""The oldest redis-py whose asyncio cluster client tenure runs on."""


def version_numbers(version: str) -> tuple[int, ...]:
    """``"8.2.0"`` -> ``(8, 2, 0)``; a pre-release suffix counts as its release."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


class RedisStore(Store, HandsOver):
    """Leases in Redis. See the module docstring."""

    scheme: ClassVar[str] = "redis"
    gate: Gate

    def __init__(
        self, url: str, *, prefix: str = "tenure", cluster: bool = False, pool_max: int = POOL_MAX
    ) -> None:
        check_pool_max(pool_max)
        if not prefix or any(ch in prefix for ch in "{}") or not prefix.isprintable():
            raise ConfigurationError(
                f"Redis key prefix {prefix!r} must be printable, non-empty and free of braces"
            )
        if cluster and sentinel.is_sentinel(url):
            raise ConfigurationError(
                "cluster=true does not go with redis+sentinel://: Sentinel manages one "
                "master and its replicas; for Redis Cluster use redis://...?cluster=true"
            )
        if sentinel.is_sentinel(url):
            sentinel.parse(url)  # a bad URL fails here, naming what is wrong
        if cluster and version_numbers(redis_sync.__version__) < _CLUSTER_NEEDS:
            raise ConfigurationError(
                "Redis Cluster needs redis-py 8.2 or newer (before 8.0 its asyncio cluster "
                "client has no pub/sub, which waiters use; 8.0 and 8.1 can close a connection "
                "under a command that is using it when several run at once); this is "
                f"{redis_sync.__version__}: pip install -U 'redis[hiredis]'"
            )
        self.url = url
        self.prefix = prefix
        self.cluster = cluster
        self.pool_max = pool_max
        self.keys = Keys(prefix)
        self.transport = Transport(url, cluster=cluster, pool_max=pool_max)
        self.gate = self.transport.gate
        self.waiting = Waiting(self.transport, self.keys, self.release)
        self._semaphores = RedisPermits(
            self.transport, self.keys, self.waiting.releases, self.describe()
        )
        self._runlog = RedisRunLog(self, self.transport, self.keys)
        self._blocking: BlockingCalls | None = None
        self._blocking_guard = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        query = url.partition("?")[2].partition("#")[0]
        ours, rest = options(
            "Redis", query, {"prefix": str, "pool_max": int, "cluster": bool}, others=True
        )
        # The rest are redis-py's. Not urlunsplit: it writes unix:///path (no
        # host) back as unix:/path, which redis-py refuses.
        base = url.partition("?")[0].partition("#")[0]
        clean = f"{base}?{urlencode(rest)}" if rest else base
        return cls(clean, **ours)

    @property
    def runlog(self) -> RedisRunLog:
        return self._runlog

    @property
    def semaphores(self) -> RedisPermits:
        return self._semaphores

    def describe(self) -> str:
        return mask(self.url)

    def sibling(self) -> RedisStore:
        # redis.asyncio connections belong to the loop that opened them.
        return self.remade()

    def blocking(self) -> BlockingCalls:
        with self._blocking_guard:  # callers on many threads: one set of connections
            if self._blocking is None:
                self._blocking = BlockingCalls(
                    self.url,
                    cluster=self.cluster,
                    pool_max=self.pool_max,
                    keys=self.keys,
                    gate=self.gate,
                )
            return self._blocking

    async def warm_up(self) -> None:
        await self.transport.warm_up()

    async def aclose(self) -> None:
        if self._blocking is not None:
            self._blocking.close()
        await self.waiting.aclose()
        await self.transport.aclose()

    # -- leases ------------------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        fence = await self.transport.script("acquire", *self.keys.acquire(name, token, ttl, holder))
        return None if fence is None else Grant(int(fence))

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        calls = [("acquire", *self.keys.acquire(*item)) for item in items]
        answers = await self.transport.scripts(calls)
        return [None if fence is None else Grant(int(fence)) for fence in answers]

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        items = [
            (self.keys.lease(item.name), (item.token, max(1, round(item.ttl * 1000))))
            for item in batch
        ]
        answers = await per_slot(self.transport.script, self.cluster, "renew", items)
        return [bool(ok) for ok in answers]

    async def release(self, name: str, token: str) -> bool:
        return bool(await self.transport.script("release", *self.keys.release(name, token)))

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        if self.cluster or not items:
            # Different names are in different hash slots: a script each.
            calls = [("release", *self.keys.release(*item)) for item in items]
            answers = await self.transport.scripts(calls)
        else:
            keys: list[str] = []
            args: list[str | int | float] = []
            for item in items:
                item_keys, item_args = self.keys.release(*item)
                keys += item_keys
                args += item_args
            answers = await self.transport.script("releases", keys, args)
        return [bool(answer) for answer in answers]

    async def wait_released(self, name: str, timeout: float) -> None:
        await self.waiting.wait_released(name, timeout)

    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        return await self.waiting.acquire_waiting(
            name, token, ttl, holder, timeout=timeout, handover=handover
        )

    # -- what operators see and do -----------------------------------------------

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        return await operators.holders(self.transport, self.keys, prefix)

    async def holder_of(self, name: str) -> LeaseInfo | None:
        # The lease's own key, not a SCAN of the key space (a skipped scheduled
        # run asks, so it must cost one round trip however many leases exist).
        found = await operators.live_grant(self.transport, self.keys, name)
        return None if found is None else found[1]

    async def force_release(self, name: str) -> LeaseInfo | None:
        return await evict(name, self._live_grant, self.release, self._bump_fence)

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        return await operators.live_grant(self.transport, self.keys, name)

    async def _bump_fence(self, name: str) -> None:
        await self.transport.call("incr", self.keys.fence(name))

    async def server_time(self) -> float | None:
        seconds, micros = await self.transport.call("time")
        return int(seconds) + int(micros) / 1e6

    async def diagnose(self) -> list[Finding]:
        found = await operators.diagnose(self.transport.client)
        if sentinel.is_sentinel(self.url):
            found += await sentinel.diagnose_replication(self.transport.client)
        return found

    async def prune(self, *, keep_runs: int) -> int:
        # Leases expire by themselves in Redis and fencing counters must stay;
        # only run records need trimming.
        runlog = self._runlog
        return sum([await runlog.trim(task, keep_runs) for task in await runlog.task_names()])
