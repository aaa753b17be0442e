"""The Redis store: leases as hashes with a server-side expiry (``PEXPIRE``).

URL forms: ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS),
``unix:///path/to/redis.sock``, with redis-py's query options
(``socket_timeout``, ``ssl_cert_reqs`` ...) and ours: ``prefix`` (default
``tenure``) and ``cluster`` (``true`` for Redis Cluster). Socket and connect
timeouts default to 2 s, so a Redis that stops answering makes ``acquire``
raise instead of hang. A command that finds
its pooled connection closed (the server restarted) is retried once on a new
connection; a timed-out one is not.

* Keys of one lock share a hash tag, ``{prefix:name}``: the lease hash
  (``...:lease``) and its fencing counter (``...:fence``, never expires).
* Acquire, release and each renewal batch are one Lua script call each (on
  Redis Cluster a batch is one call per hash slot, sent together)
  (``redis_scripts/*.lua``, each headed by its KEYS, ARGV and return). Expiry
  is Redis's own ``PEXPIRE``; no client timestamp is ever compared.
* Fencing tokens never go below the server's ``TIME`` in microseconds, so a
  Redis without persistence that restarts empty still hands out larger ones.
  What such a restart does lose is the leases themselves: a holder keeps
  believing it holds a lock that another client can now acquire, until its
  next renewal finds the token gone. With ``appendonly yes`` and
  ``appendfsync always`` the leases survive a restart.
* Waiters that are not queued (below) subscribe to the lease's release
  channel before they look at the lease again, so a release between the two
  cannot be missed; they also wake when
  the lease's remaining time (``PTTL``) runs out. A channel stays subscribed
  a few seconds after its last waiter left.
* Grant on release: one waiter per lock queues itself (``...:next``, with its
  token) in the script that finds the lock held, and calls again every third
  of ``QUEUE_LIFE`` to keep its entry alive. The release script hands the
  lease straight to it and pushes a note onto ``...:handed``, on which the
  waiter blocks in ``BLPOP``: it holds the lock as soon as it reads the note,
  with no round trip of its own. The handed-over lease is short
  (``renewer.handover_lease``: the new holder's renewer extends it at once):
  a queued waiter that died costs the name a second or two, not a whole TTL.
* Speed: each script call is written pre-encoded on a connection the store
  keeps pinned (its *lane*; on Redis Cluster one per node, to the node that
  serves the keys' slot), bypassing redis-py's general command path, which
  costs more than the round trip; concurrent calls that find it busy use the
  pool. A cluster node that answers MOVED, ASK, TRYAGAIN, CLUSTERDOWN or
  READONLY did not run the script: it is sent again the general way, which
  follows the cluster's new shape. For blocking callers (``tenure.sync``),
  ``blocking()`` acquires and releases the same way through redis-py's
  blocking connections, on the caller's thread (on a cluster, idle
  connections per node, with the same fallback).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, ClassVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis as redis_sync
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MasterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry as BlockingRetry

from .._aio import woken_within
from .._tokens import new_token
from ..errors import ConfigurationError, StoreUnavailable
from . import _mask
from ._gate import Gate
from ._options import POOL_MAX, check_pool_max, number
from ._waiters import QUEUE_LIFE, Wakeups
from .base import (
    AcquireItem,
    BlockingLeases,
    Finding,
    Grant,
    HandedOver,
    LeaseInfo,
    ReleaseItem,
    RenewItem,
    Store,
)
from .runlog import Claim, RunLog, RunRecord, Started, StartItem

__all__ = ("RedisStore",)

# What the driver raises when the server cannot be reached or fails; a
# cluster's own errors are not RedisError subclasses.
_DRIVER_ERRORS = (RedisError, RedisClusterException, OSError)

log = logging.getLogger("tenure.stores.redis")

_UNSUBSCRIBE_AFTER = 5.0
"""Seconds a release channel stays subscribed after its last waiter left."""

_SCRIPTS = (
    "acquire",
    "enlist",
    "release",
    "withdraw",
    "renew",
    "claim",
    "record",
    "abandon",
    "start",
    "releases",
    "records",
)
_PRELUDES = {
    "acquire": ("_grant", "_acquire"),
    "enlist": ("_grant",),
    "release": ("_grant", "_release"),
    "releases": ("_grant", "_release"),
    "claim": ("_claim",),
    "record": ("_record",),
    "records": ("_record",),
    "start": ("_grant", "_acquire", "_claim", "_record"),
}
"""The shared functions (``_*.lua``) each script starts with, so that a rule is written once."""


_NOT_SERVED_HERE = (AskError, TryAgainError, ClusterDownError, ReadOnlyError, MasterDownError)
"""Cluster replies that mean the node did not run the command (MovedError is an AskError)."""


class _Lane:
    """A connection a store keeps pinned for its pre-encoded script calls."""

    __slots__ = ("busy", "conn", "node")

    def __init__(self, node: Any = None) -> None:
        self.node = node
        """The Redis Cluster node it connects to; None for a single server."""
        self.conn: Any = None
        self.busy = False


_CLUSTER_NEEDS = (8, 2)
"""The oldest redis-py whose asyncio cluster client tenure runs on (see RedisStore)."""


def _version_numbers(version: str) -> tuple[int, ...]:
    """``"8.2.0"`` -> ``(8, 2, 0)``; a pre-release suffix counts as its release."""
    numbers = []
    for part in version.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def _read_script(name: str) -> str:
    return resources.files("tenure.stores").joinpath(f"redis_scripts/{name}.lua").read_text()


def _load_script(name: str) -> str:
    return "".join(map(_read_script, (*_PRELUDES.get(name, ()), name)))


_SOURCES = {name: _load_script(name) for name in _SCRIPTS}
# What EVALSHA names each script by: SHA-1 of its source, as the server computes it.
_SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in _SOURCES.items()}
_SHA_BYTES = {name: sha.encode() for name, sha in _SHAS.items()}


def _client(factory: Any, url: str, pool_max: int, retry: type[Any] = Retry) -> Any:
    """A redis-py client (asyncio or blocking) with tenure's timeouts and retry."""
    try:
        return factory(
            url,
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
            # The store's gate keeps calls in flight within pool_max, and as many
            # waiters BLPOP at once; redis-py's own bound (which fails a call at
            # once when reached) only backs that up, with room for pub/sub.
            max_connections=2 * pool_max + 4,
            decode_responses=False,
            # One immediate retry on a broken connection (a restarted server
            # closes every pooled one), never on a timeout: a timed-out command
            # may have run, and a retried acquire would then see its own lease
            # as contention.
            retry=retry(NoBackoff(), 1, (RedisConnectionError,)),
        )
    except (ValueError, TypeError, RedisError) as exc:
        raise ConfigurationError(f"bad Redis URL {_mask(url)!r}: {exc}") from None


def _socket_timeout(url: str) -> float:
    """The URL's ``socket_timeout`` (2 s unless given): also how long a call may
    queue for a connection."""
    for key, value in parse_qsl(url.partition("?")[2]):
        if key == "socket_timeout":
            seconds = number("Redis", key, value, float)
            if not 0 < seconds <= 3600:
                raise ConfigurationError(
                    f"socket_timeout must be between 0 and 3600 seconds, got {value!r}"
                )
            return float(seconds)
    return 2.0


def _packed_here(parts: tuple[bytes | str | int | float, ...]) -> bytes:
    """The RESP encoding of a command, as redis-py encodes it: str as UTF-8, a
    float as its repr, an int in decimal."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, bytes):
            raw = part
        elif isinstance(part, str):
            raw = part.encode()
        else:
            raw = (repr(part) if isinstance(part, float) else str(part)).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


_Packer = Callable[[tuple[bytes | str | int | float, ...]], bytes]
try:  # the same bytes, from C: a batch of a thousand items is encoded in a third of the time
    import hiredis

    # Its stub types the argument as a tuple of one item; it takes any number.
    _pack_command = cast(_Packer, hiredis.pack_command)
except ImportError:  # redis-py without its hiredis extra
    _pack_command = _packed_here


def _packed(*parts: bytes | str | int | float) -> bytes:
    """The RESP encoding of a command (see ``_packed_here``)."""
    return _pack_command(parts)


def _evalsha(name: str, keys: Sequence[str], args: Sequence[str | int | float]) -> bytes:
    """``EVALSHA sha numkeys keys... args...``, encoded."""
    return _packed(b"EVALSHA", _SHA_BYTES[name], len(keys), *keys, *args)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _escape_glob(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


class RedisStore(Store, RunLog):
    """Leases in Redis. See the module docstring."""

    gate: Gate

    scheme: ClassVar[str] = "redis"

    @property
    def runlog(self) -> RunLog:
        return self

    @property
    def leases(self) -> Store:
        return self

    def __init__(
        self, url: str, *, prefix: str = "tenure", cluster: bool = False, pool_max: int = POOL_MAX
    ) -> None:
        check_pool_max(pool_max)
        if not prefix or any(ch in prefix for ch in "{}") or not prefix.isprintable():
            raise ConfigurationError(
                f"Redis key prefix {prefix!r} must be printable, non-empty and free of braces"
            )
        if cluster and _version_numbers(redis_sync.__version__) < _CLUSTER_NEEDS:
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
        self.gate = Gate(pool_max, _socket_timeout(url), what=f"Redis at {_mask(url)}")
        """The bound on this store's commands in flight (see ``stores._gate``)."""
        factory: Any = aioredis.RedisCluster.from_url if cluster else aioredis.from_url
        self._client: Any = _client(factory, url, pool_max)
        self._popping = 0
        """Queued waiters in BLPOP now: at most ``pool_max`` (the rest wait on pub/sub)."""
        self._lane = _Lane()
        """The single server's lane (see ``_script_on_lane``)."""
        self._node_lanes: dict[str, _Lane] = {}
        """A lane per Redis Cluster node, by node name."""
        self._retired_lanes: list[_Lane] = []
        """Lanes to nodes that a topology refresh replaced."""
        self._pubsub: Any = None
        self._subscribing: asyncio.Lock | None = None
        self._listener: asyncio.Task[None] | None = None
        self._confirmed: dict[bytes, asyncio.Event] = {}
        self._waiting: Wakeups[bytes] = Wakeups()
        self._withdrawing: set[asyncio.Task[None]] = set()
        self._poppers: list[Any] = []
        """Idle connections that queued waiters BLPOP on (single server)."""
        self._blocking_calls: _BlockingCalls | None = None
        self._blocking_guard = threading.Lock()

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        prefix = "tenure"
        cluster = False
        pool_max = POOL_MAX
        rest = []
        for key, value in query:
            if key == "prefix":
                prefix = value
            elif key == "pool_max":
                pool_max = int(number("Redis", key, value, int))
            elif key == "cluster":
                if value.lower() not in ("true", "yes", "1", "false", "no", "0"):
                    raise ConfigurationError(f"cluster must be true or false, got {value!r}")
                cluster = value.lower() in ("true", "yes", "1")
            else:
                rest.append((key, value))
        # Not urlunsplit: it writes unix:///path (no host) back as unix:/path,
        # which redis-py refuses.
        base = url.partition("?")[0].partition("#")[0]
        clean = f"{base}?{urlencode(rest)}" if rest else base
        return cls(clean, prefix=prefix, cluster=cluster, pool_max=pool_max)

    def describe(self) -> str:
        return _mask(self.url)

    def sibling(self) -> RedisStore:
        # redis.asyncio connections belong to the loop that opened them.
        return RedisStore(
            self.url, prefix=self.prefix, cluster=self.cluster, pool_max=self.pool_max
        )

    async def warm_up(self) -> None:
        with contextlib.suppress(*_DRIVER_ERRORS):
            if self.cluster:
                await self._client.initialize()  # the slot map and a connection per node
            else:
                await self._client.ping()

    async def aclose(self) -> None:
        if self._blocking_calls is not None:
            self._blocking_calls.close()
        if self._withdrawing:
            await asyncio.gather(*self._withdrawing, return_exceptions=True)
        for lane in (self._lane, *self._node_lanes.values(), *self._retired_lanes):
            await self._drop_lane(lane)
        while self._poppers:
            await self._client.connection_pool.release(self._poppers.pop())
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self._client.aclose()

    # -- keys and scripts ----------------------------------------------------

    def _tag(self, name: str) -> str:
        return f"{{{self.prefix}:{name}}}"

    def _lease(self, name: str) -> str:
        return self._tag(name) + ":lease"

    def _channel(self, name: str) -> str:
        return self._tag(name) + ":released"

    async def _script(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        async with self.gate:
            lane = self._node_lane(keys[0]) if self.cluster else self._lane
            if lane is not None and not lane.busy:
                return await self._script_on_lane(lane, name, keys, args)
            return await self._script_via_pool(name, keys, args)

    async def _script_via_pool(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        before = _cancel_requests()
        answer = await self._script_in_pool(name, keys, args)
        _raise_swallowed_cancel(before)
        return answer

    async def _script_in_pool(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        try:
            try:
                return await self._client.evalsha(_SHAS[name], len(keys), *keys, *args)
            except NoScriptError:  # the server restarted or flushed its script cache
                await self._client.script_load(_SOURCES[name])
                return await self._client.evalsha(_SHAS[name], len(keys), *keys, *args)
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc

    def _node_lane(self, key: str) -> _Lane | None:
        """The lane to the Redis Cluster node that serves ``key``; None before the
        client has its slot map (the general path loads it)."""
        try:
            node = self._client.get_node_from_key(key)
        except _DRIVER_ERRORS:
            return None
        if node is None:
            return None
        lane = self._node_lanes.get(node.name)
        if lane is None or lane.node is not node:
            # First use, or the node was replaced by a topology refresh: the old
            # lane's connection is closed with the store (its node is not).
            if lane is not None:
                self._retired_lanes.append(lane)
            lane = self._node_lanes[node.name] = _Lane(node)
        return lane

    async def _script_on_lane(
        self, lane: _Lane, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """EVALSHA, pre-encoded, on a connection the store keeps pinned (a *lane*):
        to the server, or to the cluster node that serves the keys.

        redis-py's general command path (pool checkout, command packing,
        response callbacks, and on a cluster its routing) costs more than the
        round trip itself; a script call that finds the lane free writes its
        bytes and reads one reply. Calls that find it busy take the general
        path. The same retry policy: once on a broken connection, never on a
        timeout. On a cluster, a redirect or a node that cannot serve (MOVED,
        ASK, TRYAGAIN, CLUSTERDOWN, READONLY: the script did not run) and a
        broken connection go to the general path, which follows the cluster's
        new shape.
        """
        lane.busy = True
        reloaded = reconnected = False
        try:
            while True:
                conn = lane.conn
                try:
                    if conn is not None and lane.node is not None and conn.should_reconnect():
                        # redis-py marks a cluster's connections after a topology
                        # change (a node's role may have changed): a new one.
                        await self._drop_lane(lane)
                        conn = None
                    if conn is None:
                        conn = await self._lane_connection(lane)
                    await conn.send_packed_command(_evalsha(name, keys, args), check_health=False)
                    return await conn.read_response()
                except NoScriptError:  # the server restarted or flushed its script cache
                    if reloaded:
                        raise
                    reloaded = True
                    await self._client.script_load(_SOURCES[name])
                except _NOT_SERVED_HERE:
                    if lane.node is None:
                        raise
                    return await self._script_via_pool(name, keys, args)
                except ResponseError:
                    raise  # an error reply: the connection itself is fine
                except BaseException as exc:
                    # A timeout or a cancellation may leave a reply unread: the
                    # connection is given up, and a new one is taken next time.
                    await self._drop_lane(lane)
                    if reconnected or not isinstance(exc, RedisConnectionError):
                        raise
                    if lane.node is not None:
                        return await self._script_via_pool(name, keys, args)
                    reconnected = True
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        finally:
            lane.busy = False

    async def _lane_connection(self, lane: _Lane) -> Any:
        if lane.node is not None:
            lane.conn = lane.node.acquire_connection()  # no I/O: it connects at its first write
        else:
            before = _cancel_requests()
            lane.conn = await self._client.connection_pool.get_connection()
            # On the lane before the check: a cancellation raised here leaves the
            # connection to _drop_lane, which gives it back to the pool.
            _raise_swallowed_cancel(before)
        return lane.conn

    async def _drop_lane(self, lane: _Lane) -> None:
        conn, lane.conn = lane.conn, None
        if conn is None:
            return
        try:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await conn.disconnect(nowait=True)
        finally:  # given back even when a cancellation interrupts the disconnect
            if lane.node is not None:
                lane.node.release(conn)
            else:
                await self._client.connection_pool.release(conn)

    async def _scripts(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[str | int | float]]]
    ) -> list[Any]:
        """Many script calls ``(script, keys, args)``, each atomic on its own:
        pipelined on a single server (one round trip). On a cluster they go
        at once, each on the lane of its node: redis-py's cluster pipeline
        would try a timed-out batch again, past the store's timeout."""
        if not calls:
            return []
        if self.cluster:
            answers = await asyncio.gather(
                *(self._script(name, keys, args) for name, keys, args in calls),
                return_exceptions=True,
            )
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
            return answers
        try:
            async with self.gate:
                before = _cancel_requests()
                answers = await self._pipelined(range(len(calls)), calls)
                _raise_swallowed_cancel(before)
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        for answer in answers:
            if isinstance(answer, Exception):
                raise StoreUnavailable(f"Redis at {self.describe()} failed: {answer}") from answer
        return answers

    async def _pipelined(
        self,
        indices: Sequence[int],
        calls: Sequence[tuple[str, Sequence[str], Sequence[str | int | float]]],
    ) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for i in indices:
            name, keys, args = calls[i]
            pipe.evalsha(_SHAS[name], len(keys), *keys, *args)
        answers: list[Any] = list(await pipe.execute(raise_on_error=False))
        unknown = [
            i
            for i, answer in zip(indices, answers, strict=True)
            if isinstance(answer, NoScriptError)
        ]
        if unknown:  # the server restarted or flushed its script cache: those did not run
            for name in sorted({calls[i][0] for i in unknown}):
                await self._client.script_load(_SOURCES[name])
            again = iter(await self._pipelined(unknown, calls))
            answers = [next(again) if isinstance(a, NoScriptError) else a for a in answers]
        return answers

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            async with self.gate:
                return await getattr(self._client, method)(*args)
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc

    # -- the contract --------------------------------------------------------

    def _acquire_call(
        self, name: str, token: str, ttl: float, holder: str
    ) -> tuple[tuple[str, str], tuple[str, int, str]]:
        tag = self._tag(name)
        return (tag + ":lease", tag + ":fence"), (token, max(1, round(ttl * 1000)), holder)

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        fence = await self._script("acquire", *self._acquire_call(name, token, ttl, holder))
        return None if fence is None else Grant(int(fence))

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        # A script may only touch keys of one hash slot on Redis Cluster: one
        # call per slot, all sent at once. A single server is one slot group.
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(batch):
            slot = key_slot(self._tag(item.name).encode()) if self.cluster else 0
            groups.setdefault(slot, []).append(i)

        async def renew_group(indices: list[int]) -> list[Any]:
            keys = [self._lease(batch[i].name) for i in indices]
            args: list[str | int | float] = []
            for i in indices:
                args += [batch[i].token, max(1, round(batch[i].ttl * 1000))]
            result: list[Any] = await self._script("renew", keys, args)
            return result

        answers = await asyncio.gather(*(renew_group(ix) for ix in groups.values()))
        results = [False] * len(batch)
        for indices, answer in zip(groups.values(), answers, strict=True):
            for i, ok in zip(indices, answer, strict=True):
                results[i] = bool(ok)
        return results

    def _release_call(self, name: str, token: str) -> tuple[tuple[str, ...], tuple[str, str]]:
        tag = self._tag(name)
        keys = (tag + ":lease", tag + ":fence", tag + ":next", tag + ":handed")
        return keys, (token, tag + ":released")

    async def release(self, name: str, token: str) -> bool:
        return bool(await self._script("release", *self._release_call(name, token)))

    def blocking(self) -> BlockingLeases:
        with self._blocking_guard:  # callers on many threads: one set of connections
            if self._blocking_calls is None:
                self._blocking_calls = _BlockingCalls(self)
            return self._blocking_calls

    async def wait_released(self, name: str, timeout: float) -> None:
        channel = self._channel(name).encode()
        woken = self._waiting.add(channel)
        try:
            if not await self._subscribed(channel, timeout):
                return
            remaining_ms = await self._call("pttl", self._lease(name))
            if remaining_ms < 0:  # -2: no lease; -1 cannot happen (always PEXPIREd)
                return
            await woken_within(woken, min(timeout, remaining_ms / 1000))
        finally:
            self._forget_wake_up(channel, woken)

    grants_on_release: ClassVar[bool] = True

    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        tag = self._tag(name)
        keys = (tag + ":lease", tag + ":fence", tag + ":next")
        handed = tag + ":handed"
        waiter = new_token()[:16]  # public: it names this waiter on the hand-over list
        args = (
            token,
            max(1, round(ttl * 1000)),
            holder,
            waiter,
            round(QUEUE_LIFE * 1000),
            max(1, round(handover * 1000)),
        )
        mine = waiter.encode() + b"|"
        deadline = time.monotonic() + timeout
        channel = (tag + ":released").encode()
        woken: asyncio.Future[None] | None = None
        queued_at: float | None = None
        """When the last call that left this waiter queued was sent."""
        called = False
        try:
            while True:
                sent = time.monotonic()
                called = True
                answer = await self._script("enlist", keys, args)
                if answer[0] == 1:
                    return HandedOver(Grant(int(answer[1])), sent, ttl)
                if answer[0] == 2:  # a release handed it over; its note is still on the list
                    return HandedOver(Grant(int(answer[1])), sent, answer[2] / 1000)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # The lease's expiry (a crashed holder) wakes every waiter too.
                wake = min(left, max(answer[1], 1) / 1000)
                if answer[0] == 0:
                    # Queued: the release hands us the lease; we call again
                    # before our entry lapses.
                    queued_at = sent
                    wake = min(wake, QUEUE_LIFE / 3)
                if answer[0] == 0 and self._popping < self.pool_max:
                    # The release notes the hand-over on the list we BLPOP.
                    note = await self._pop(handed, wake)
                    if note is not None and note.startswith(mine):
                        assert queued_at is not None
                        # Its since counts from our last call that kept us queued,
                        # so queued_at + since is no later than the grant.
                        _, fence, since = note.split(b"|")
                        return HandedOver(
                            Grant(int(fence)), queued_at + int(since) / 1000, handover
                        )
                # Not queued, or as many queued waiters BLPOP as the pool allows:
                # woken by the release's message, a queued waiter learns of its
                # hand-over from its next call (answer 2).
                elif woken is None or channel not in self._confirmed:
                    # Another waiter is queued: wake on any release, and look
                    # again once subscribed (a release may have come between).
                    woken = self._waiting.add(channel, instead_of=woken)
                    if not await self._subscribed(channel, left):
                        break
                else:
                    await woken_within(woken, wake)
                    woken = self._waiting.add(channel, instead_of=woken)
            if queued_at is None:
                return None
            # Out of time: leave the queue; a lease handed over meanwhile is kept.
            sent = time.monotonic()
            answer = await self._script("withdraw", (keys[0], keys[2]), (token, waiter))
            if answer is None:
                return None
            return HandedOver(Grant(int(answer[0])), sent, answer[1] / 1000)
        except BaseException:
            if called:
                # Cancelled or failed with a call in flight or an entry queued:
                # the store may have queued us or handed us the lease.
                task = asyncio.ensure_future(self._abandon(name, keys, token, waiter))
                self._withdrawing.add(task)
                task.add_done_callback(self._withdrawing.discard)
            raise
        finally:
            if woken is not None:
                self._forget_wake_up(channel, woken)

    async def _pop(self, key: str, timeout: float) -> bytes | None:
        """BLPOP one note from ``key``, waiting up to ``timeout`` seconds; None if none came.

        On a single server, pre-encoded on a connection of its own, as the lane
        does: the note is read the moment it lands. Waiting connections are
        kept by the store for the next wait (``_poppers``).
        """
        seconds = f"{max(timeout, 0.001):.3f}"
        before = _cancel_requests()
        self._popping += 1
        try:
            if self.cluster:
                answer = await self._client.blpop([key], float(seconds))
            else:
                pool = self._client.connection_pool
                conn = self._poppers.pop() if self._poppers else await pool.get_connection()
                try:
                    _raise_swallowed_cancel(before)  # (taking a pooled connection)
                    packed = _packed(b"BLPOP", key, seconds)
                    await conn.send_packed_command(packed, check_health=False)
                    answer = await conn.read_response(timeout=timeout + 2.0)
                except BaseException:
                    # A timeout or a cancellation may leave the reply unread.
                    with contextlib.suppress(*_DRIVER_ERRORS):
                        await conn.disconnect(nowait=True)
                    await pool.release(conn)
                    raise
                # Kept for the next wait rather than given back to the pool,
                # whose release would stand between the note and the waiter.
                self._poppers.append(conn)
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        finally:
            self._popping -= 1
        if self.cluster:
            _raise_swallowed_cancel(before)
        return None if answer is None else answer[1]

    async def _abandon(
        self, name: str, keys: tuple[str, str, str], token: str, waiter: str
    ) -> None:
        """Withdraw a waiter that gave up abnormally, and release what it may have been handed."""
        try:
            await self._script("withdraw", (keys[0], keys[2]), (token, waiter))
            await self.release(name, token)
        except StoreUnavailable as exc:
            # Lapses by itself: the queue entry within QUEUE_LIFE, a
            # handed-over lease within its short hand-over lease.
            log.debug("could not withdraw an abandoned waiter of %r: %s", name, exc)

    def _forget_wake_up(self, channel: bytes, woken: asyncio.Future[None]) -> None:
        self._waiting.remove(channel, woken)
        if channel not in self._waiting:
            self._unsubscribe(channel)

    async def _subscribed(self, channel: bytes, timeout: float) -> bool:
        """Subscribe to ``channel`` and wait for the server's confirmation; False on timeout.

        Subscribed (confirmed) first, then look at the lease: a release in
        between cannot be missed.
        """
        try:
            confirmed = await self._subscribe(channel)
            # asyncio.timeout: on 3.11 wait_for can drop a cancellation that
            # comes as the confirmation does, and the waiter would wait on.
            async with asyncio.timeout(min(max(timeout, 0.0), 3600.0)):
                await confirmed.wait()
        except TimeoutError:
            return False
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        return True

    async def _subscribe(self, channel: bytes) -> asyncio.Event:
        """Subscribe the store's one pub/sub connection to ``channel``; its confirmation.

        One waiter at a time: the listener may only start reading once a first
        SUBSCRIBE has given the pub/sub object its connection.
        """
        if self._subscribing is None:
            self._subscribing = asyncio.Lock()
        async with self._subscribing:
            if self._pubsub is None:
                if self.cluster:
                    # A cluster client's pub/sub needs the slot map, which a
                    # client used only for waiting (tenure.sync) has not loaded.
                    await self._client.initialize()
                self._pubsub = self._client.pubsub()
            confirmed = self._confirmed.get(channel)
            if confirmed is None:
                confirmed = self._confirmed[channel] = asyncio.Event()
                await self._pubsub.subscribe(channel)
            if self._listener is None or self._listener.done():
                self._listener = asyncio.ensure_future(self._listen(self._pubsub))
        return confirmed

    def _unsubscribe(self, channel: bytes) -> None:
        """Unsubscribe ``channel`` a little later, if nobody waits on it by then.

        Not at once: the waiter that just woke is about to acquire, and the
        UNSUBSCRIBE would compete with that acquire for the loop; and a name
        waited on once is often waited on again.
        """
        asyncio.get_running_loop().call_later(_UNSUBSCRIBE_AFTER, self._unsubscribe_idle, channel)

    def _unsubscribe_idle(self, channel: bytes) -> None:
        if channel in self._waiting or self._confirmed.pop(channel, None) is None:
            return  # waited on again, or the connection was replaced meanwhile
        pubsub = self._pubsub
        if pubsub is not None:
            task = asyncio.ensure_future(pubsub.unsubscribe(channel))
            task.add_done_callback(_quiet)

    async def _listen(self, pubsub: Any) -> None:
        """Read the pub/sub connection: confirm subscriptions, wake waiters on releases."""
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                channel = message["channel"]
                if message["type"] == "subscribe":
                    confirmed = self._confirmed.get(channel)
                    if confirmed is not None:
                        confirmed.set()
                elif message["type"] == "message":
                    self._waiting.wake(channel)
        except _DRIVER_ERRORS as exc:
            log.debug("the Redis pub/sub connection failed, waiters re-check: %s", exc)
        finally:
            # Whatever ended the connection, every waiter wakes to re-check, and
            # the next wait opens a new one.
            if self._pubsub is pubsub:
                self._pubsub = None
                self._confirmed.clear()
            self._waiting.wake_all()
            with contextlib.suppress(*_DRIVER_ERRORS):
                await asyncio.shield(pubsub.aclose())

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        pattern = f"{{{_escape_glob(self.prefix)}:{_escape_glob(prefix)}*}}:lease"
        # One turn for the whole listing: it uses one connection at a time.
        async with self.gate:
            return await self._holders_in_turn(pattern)

    async def _holders_in_turn(self, pattern: str) -> list[LeaseInfo]:
        try:
            keys = [key async for key in self._client.scan_iter(match=pattern, count=500)]
            infos = []
            # A pipeline per 500 leases, not a round trip per lease: `tenure locks`
            # on 10,000 held locks is 20 round trips.
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                async with self._client.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.hmget(key, "holder", "fence", "acquired")
                        pipe.pttl(key)
                    answers = await pipe.execute()
                for key, (holder, fence, acquired), pttl in zip(
                    chunk, answers[::2], answers[1::2], strict=True
                ):
                    if fence is None or pttl < 0:
                        continue  # released or expired since the scan saw it
                    name = key.decode()[len(self.prefix) + 2 : -len("}:lease")]
                    at = float(acquired) if acquired is not None else None
                    info = LeaseInfo(name, (holder or b"").decode(), int(fence), pttl / 1000, at)
                    infos.append(info)
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        return sorted(infos, key=lambda info: info.name)

    async def server_time(self) -> float | None:
        seconds, micros = await self._call("time")
        return int(seconds) + int(micros) / 1e6

    async def diagnose(self) -> list[Finding]:
        found = []
        config: dict[str, str] = {}
        try:
            for name in ("maxmemory-policy", "appendonly", "appendfsync", "save"):
                answer: Any = await self._client.config_get(name)
                config.update({_text(k): _text(v) for k, v in answer.items()})
        except _DRIVER_ERRORS as exc:
            return [
                Finding(
                    "warn",
                    f"could not read the server's configuration: {exc}",
                    "allow CONFIG GET to tenure's user, or check these settings by hand",
                )
            ]
        policy = config.get("maxmemory-policy", "")
        if policy and policy != "noeviction":
            found.append(
                Finding(
                    "unsafe",
                    f"maxmemory-policy is {policy}: under memory pressure Redis evicts keys, "
                    "leases included, and a held lock can be granted again",
                    "set maxmemory-policy noeviction (or give tenure a Redis of its own)",
                )
            )
        else:
            found.append(Finding("ok", "maxmemory-policy is noeviction: leases are never evicted"))
        appendonly = config.get("appendonly", "no")
        fsync = config.get("appendfsync", "")
        if appendonly != "yes":
            save = config.get("save", "")
            found.append(
                Finding(
                    "warn",
                    "no append-only file"
                    + (f" (snapshots only: save {save!r})" if save else " and no snapshots")
                    + ": a restart forgets the leases, and another client can be granted a "
                    "lock whose holder still runs until its next renewal (fencing tokens still "
                    "increase)",
                    "appendonly yes with appendfsync always keeps every grant across a restart",
                )
            )
        elif fsync != "always":
            found.append(
                Finding(
                    "warn",
                    f"appendonly yes with appendfsync {fsync}: a crash can lose the last second "
                    "of grants",
                    "appendfsync always keeps every grant across a crash",
                )
            )
        else:
            found.append(
                Finding("ok", "appendonly yes, appendfsync always: grants survive a restart")
            )
        return found

    async def holder_of(self, name: str) -> LeaseInfo | None:
        # The lease's own key, not a SCAN of the key space (a skipped scheduled
        # run asks, so it must cost one round trip however many leases exist).
        found = await self._live_grant(name)
        return None if found is None else found[1]

    async def _live_grant(self, name: str) -> tuple[str, LeaseInfo] | None:
        key = self._lease(name)
        try:
            async with self.gate, self._client.pipeline(transaction=False) as pipe:
                pipe.hmget(key, "token", "holder", "fence", "acquired")
                pipe.pttl(key)
                (token, holder, fence, acquired), pttl = await pipe.execute()
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        if token is None or fence is None or pttl < 0:
            return None
        at = float(acquired) if acquired is not None else None
        info = LeaseInfo(name, (holder or b"").decode(), int(fence), pttl / 1000, at)
        return token.decode(), info

    async def _bump_fence(self, name: str) -> None:
        await self._call("incr", self._tag(name) + ":fence")

    # -- the scheduler's records -----------------------------------------------

    def _runs_keys(self, task: str) -> tuple[str, str]:
        tag = f"{{{self.prefix}:runs:{task}}}"
        return tag + ":records", tag + ":index"

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return (await self.claim_occurrences([Claim(task, fire_time, claimant)]))[0]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        if not claims:
            return []
        # Every claim key is in one slot ({prefix:claims}): one script call, on
        # a cluster too.
        keys = [f"{{{self.prefix}:claims}}:{claim.task}" for claim in claims]
        args: list[str | int | float] = []
        for claim in claims:
            args += [repr(float(claim.fire_time)), claim.claimant]
        answers = await self._script("claim", keys, args)
        return [bool(answer) for answer in answers]

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        # One slot ({prefix:claims}), so one MGET on a cluster too.
        keys = [f"{{{self.prefix}:claims}}:{task}" for task, _ in occurrences]
        values: list[bytes | None] = await self._call("mget", keys)
        answers = []
        for value, (_, fire) in zip(values, occurrences, strict=True):
            # '<fire time>\n<claimant>'; a key of an older shape answers False,
            # and the claim itself then says what is wrong.
            last, sep, _claimant = (value or b"").partition(b"\n")
            answers.append(bool(sep) and float(last) >= fire)
        return answers

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        answers = await self._scripts([("acquire", *self._acquire_call(*item)) for item in items])
        return [None if fence is None else Grant(int(fence)) for fence in answers]

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        if self.cluster or not items:
            # A claim, a lease and a task's records are in different hash slots.
            return await super().start_runs(items, keep=keep)
        keys = [f"{{{self.prefix}:tasks}}"]
        args: list[str | int | float] = []
        for claim, lock, record in items:
            lease_keys, lease_args = self._acquire_call(*lock)
            keys += [f"{{{self.prefix}:claims}}:{claim.task}", *lease_keys]
            keys += self._runs_keys(record.task)
            args += [repr(float(claim.fire_time)), claim.claimant, *lease_args]
            # Its fence last, null: start.lua writes the grant's in its place.
            row = json.dumps((*record.row()[:-1], None))
            args += [record.run_id, row, repr(record.started), record.task]
        answers = await self._script("start", keys, args)
        return [
            Started(answer >= 0, Grant(int(answer)) if answer > 0 else None) for answer in answers
        ]

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        if self.cluster or not items:
            # Different names are in different hash slots: a script each.
            calls = [("release", *self._release_call(*item)) for item in items]
            answers = await self._scripts(calls)
        else:
            keys: list[str] = []
            args: list[str | int | float] = []
            for item in items:
                item_keys, item_args = self._release_call(*item)
                keys += item_keys
                args += item_args
            answers = await self._script("releases", keys, args)
        return [bool(answer) for answer in answers]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        if not records:
            return
        tasks = f"{{{self.prefix}:tasks}}"
        if self.cluster:
            # Each task's records are in a hash slot of their own: a script each.
            await self._scripts([("record", *self._record_call(r, keep)) for r in records])
            await self._call("sadd", tasks, *sorted({r.task for r in records}))
            return
        keys = [tasks]
        args: list[str | int | float] = []
        for record in records:
            record_keys, record_args = self._record_call(record, keep)
            keys += record_keys
            args += [*record_args, record.task]
        await self._script("records", keys, args)

    def _record_call(
        self, record: RunRecord, keep: int
    ) -> tuple[tuple[str, str], tuple[str, str, str, int]]:
        # RunRecord's fields in order; runs() rebuilds it with RunRecord.from_row(fields).
        payload = json.dumps(record.row())
        trim = keep if record.ended is not None else 0
        return self._runs_keys(record.task), (record.run_id, payload, repr(record.started), trim)

    async def _trim(self, task: str, keep: int) -> int:
        records, index = self._runs_keys(task)
        return int(await self._script("record", (records, index), ("", "", "0", keep)))

    async def _task_names(self) -> list[str]:
        names: Any = await self._call("smembers", f"{{{self.prefix}:tasks}}")
        return [name.decode() for name in names]

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        answers = await self._scripts(
            [
                ("abandon", (self._runs_keys(r.task)[0],), (r.run_id, json.dumps(r.row())))
                for r in records
            ]
        )
        return sum(int(answer) for answer in answers)

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        try:
            if task is None:
                tasks = await self._task_names()
            else:
                tasks = [task]
            found: list[RunRecord] = []
            for name in tasks:
                records, index = self._runs_keys(name)
                ids: Any = await self._call("zrevrange", index, 0, limit - 1)
                if ids:
                    for raw in await self._call("hmget", records, list(ids)):
                        if raw is not None:
                            found.append(RunRecord.from_row(json.loads(raw)))
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc
        found.sort(key=lambda r: r.started, reverse=True)
        return found[:limit]

    async def prune(self, *, keep_runs: int) -> int:
        # Leases expire by themselves in Redis and fencing counters must stay;
        # only run records need trimming.
        try:
            tasks = await self._task_names()
            return sum([await self._trim(task, keep_runs) for task in tasks])
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.describe()} failed: {exc}") from exc


class _BlockingCalls(BlockingLeases):
    """The Redis store's acquire and release for blocking callers (``tenure.sync``).

    They go through redis-py's blocking client, on the caller's thread: the
    same scripts, keys and results as the store's coroutines, which serve
    everything else (waiters on the API's loop thread, and the renewer).
    """

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._blocking: Any = _client(
            redis_sync.RedisCluster.from_url if store.cluster else redis_sync.Redis.from_url,
            store.url,
            store.pool_max,
            BlockingRetry,
        )
        self._idle: list[Any] = []
        """Idle connections of ``_on_lane`` (single server)."""
        self._node_idle: dict[str, tuple[Any, list[Any]]] = {}
        """Per Redis Cluster node (by name): its connection pool and our idle connections."""

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        fence = self._script("acquire", *self.store._acquire_call(name, token, ttl, holder))
        return None if fence is None else Grant(int(fence))

    def release(self, name: str, token: str) -> bool:
        return bool(self._script("release", *self.store._release_call(name, token)))

    def _script(self, name: str, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        with self.store.gate.blocking():
            return self._script_in_turn(name, keys, args)

    def _script_in_turn(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        try:
            if not self.store.cluster:
                pool = self._blocking.connection_pool
                return self._on_lane(pool, self._idle, name, keys, args)
            lane = self._node_lane(keys[0])
            if lane is not None:
                try:
                    return self._on_lane(*lane, name, keys, args, retry_broken=False)
                except (*_NOT_SERVED_HERE, RedisConnectionError):
                    pass  # it did not run there, or the node went: the general way follows
            try:
                return self._blocking.evalsha(_SHAS[name], len(keys), *keys, *args)
            except NoScriptError:  # the server restarted or flushed its script cache
                self._blocking.script_load(_SOURCES[name])
                return self._blocking.evalsha(_SHAS[name], len(keys), *keys, *args)
        except _DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"Redis at {self.store.describe()} failed: {exc}") from exc

    def _node_lane(self, key: str) -> tuple[Any, list[Any]] | None:
        """The connection pool of the cluster node that serves ``key``, with the
        store's idle connections to it; None when redis-py has none yet."""
        try:
            node = self._blocking.get_node_from_key(key)
        except _DRIVER_ERRORS:
            return None
        client = None if node is None else node.redis_connection
        if client is None:
            return None
        pool = client.connection_pool
        lane = self._node_idle.get(node.name)
        if lane is None or lane[0] is not pool:  # first use, or the node was replaced
            lane = self._node_idle[node.name] = (pool, [])
        return lane

    def _on_lane(
        self,
        pool: Any,
        idle: list[Any],
        name: str,
        keys: Sequence[str],
        args: Sequence[str | int | float],
        *,
        retry_broken: bool = True,
    ) -> Any:
        """EVALSHA, pre-encoded, on an idle connection of the store's own: the
        blocking form of ``RedisStore._script_on_lane``, with the same retry policy (on a
        cluster node a broken connection is the caller's to route anew).

        Any thread may call it: each call takes a connection off the idle list
        (list.pop and append are atomic), or a new one from the pool, and puts
        it back after reading its reply.
        """
        reloaded = reconnected = False
        while True:
            try:
                conn = idle.pop()
            except IndexError:  # none idle (another thread may just have taken the last)
                conn = pool.get_connection()
            try:
                conn.send_packed_command([_evalsha(name, keys, args)], check_health=False)
                answer = conn.read_response()
            except NoScriptError:  # the server restarted or flushed its script cache
                idle.append(conn)
                if reloaded:
                    raise
                reloaded = True
                self._blocking.script_load(_SOURCES[name])
                continue
            except ResponseError:
                idle.append(conn)  # an error reply: the connection itself is fine
                raise
            except BaseException as exc:
                # A timeout or an interruption may leave a reply unread.
                conn.disconnect()
                pool.release(conn)
                if reconnected or not retry_broken or not isinstance(exc, RedisConnectionError):
                    raise
                reconnected = True
                continue
            idle.append(conn)
            return answer

    def close(self) -> None:
        while self._idle:
            self._blocking.connection_pool.release(self._idle.pop())
        for pool, idle in self._node_idle.values():
            while idle:
                pool.release(idle.pop())
        self._blocking.close()


def _cancel_requests() -> int:
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def _raise_swallowed_cancel(before: int) -> None:
    """Raise the cancellation that redis-py swallowed during a call, if it did.

    redis-py's asyncio client (seen with 8.1 on Python 3.11) can lose a
    cancellation that arrives while it takes a pooled connection: the call
    completes, the task's cancel request stays pending (``cancelling()``) and
    nothing is raised. A waiter would then return a lock to a caller that
    cancelled it (an ``asyncio.timeout`` around it would never fire); raised
    here, the caller's cancellation path gives back what the call obtained.
    Checked after every redis-py call that takes a pooled connection (the
    lane's own reads and writes do not).
    """
    if _cancel_requests() > before:
        raise asyncio.CancelledError


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("unsubscribing failed: %s", task.exception())
