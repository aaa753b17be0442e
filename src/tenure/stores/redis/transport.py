"""How the Redis store's commands reach the server: connections, lanes, retry, errors.

Every redis-py internal the store relies on is used here only.

* Client: socket and connect timeouts of 2 s (``socket_timeout`` in the URL),
  so a Redis that stops answering makes a call raise instead of hang. At most
  ``pool_max`` commands are in flight (the store's ``gate``); callers past it
  queue for a turn.
* Lanes: each script call is written pre-encoded on a connection the store
  keeps pinned (its *lane*; on Redis Cluster one per node, to the node that
  serves the keys' slot), bypassing redis-py's general command path, which
  costs more than the round trip. Calls that find the lane busy use the pool.
  A cluster node that answers MOVED, ASK, TRYAGAIN, CLUSTERDOWN or READONLY
  did not run the script: it is sent again the general way, which follows the
  cluster's new shape.
* Retry: the stores' one policy (``stores._retry``), once on a broken
  connection, never on a timeout; a script the server does not know (it
  restarted, or its cache was flushed) is loaded and sent again.
* A cancellation redis-py swallows is raised again after every call
  (``cancels``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import redis as redis_sync
import redis.asyncio as aioredis
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
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

from ...errors import ConfigurationError
from .._errors import Translated
from .._gate import Gate
from .._options import mask, number
from .._retry import once_more
from . import sentinel
from .cancels import cancel_requests, raise_swallowed_cancel
from .scripts import SHAS, SOURCES, evalsha, packed

__all__ = ("DRIVER_ERRORS", "NOT_SERVED_HERE", "Transport", "broken", "client", "factory_for")

T = TypeVar("T")

DRIVER_ERRORS = (RedisError, RedisClusterException, OSError)
"""What the driver raises when the server cannot be reached or fails; a
cluster's own errors are not RedisError subclasses."""

NOT_SERVED_HERE = (AskError, TryAgainError, ClusterDownError, ReadOnlyError, MasterDownError)
"""Cluster replies that mean the node did not run the command (MovedError is an AskError)."""

Calls = Sequence[tuple[str, Sequence[str], Sequence[str | int | float]]]
"""Script calls: ``(script, keys, args)``."""


def client(factory: Any, url: str, pool_max: int, retry: type[Any] = Retry) -> Any:
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
            # redis-py's own retry, for the general path, by the same policy.
            retry=retry(NoBackoff(), 1, (RedisConnectionError,)),
        )
    except (ValueError, TypeError, RedisError) as exc:
        raise ConfigurationError(f"bad Redis URL {mask(url)!r}: {exc}") from None


def factory_for(url: str, cluster: bool, *, blocking: bool) -> Callable[..., Any]:
    """What makes the client for ``url``: redis-py's ``from_url`` (Redis Cluster's,
    or the Sentinel-managed master's for ``redis+sentinel://``)."""
    if sentinel.is_sentinel(url):
        managing = redis_sync.sentinel.Sentinel if blocking else aioredis.sentinel.Sentinel
        return functools.partial(sentinel.master_client, managing)
    if blocking:
        return redis_sync.RedisCluster.from_url if cluster else redis_sync.Redis.from_url
    return aioredis.RedisCluster.from_url if cluster else aioredis.from_url


def socket_timeout(url: str) -> float:
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


def broken(exc: BaseException) -> bool:
    """A connection the server closed: nothing of the command ran."""
    return isinstance(exc, RedisConnectionError) and not isinstance(exc, sentinel.NO_MASTER)


class _Lane:
    """A connection the store keeps pinned for its pre-encoded script calls."""

    __slots__ = ("busy", "conn", "node")

    def __init__(self, node: Any = None) -> None:
        self.node = node
        """The Redis Cluster node it connects to; None for a single server."""
        self.conn: Any = None
        self.busy = False


class Transport:
    """The asyncio connection paths of one store (see the module docstring)."""

    def __init__(self, url: str, *, cluster: bool, pool_max: int) -> None:
        self.url = url
        self.cluster = cluster
        self.pool_max = pool_max
        self.translated = Translated(DRIVER_ERRORS, f"Redis at {mask(url)}", sentinel.said)
        self.gate = Gate(pool_max, socket_timeout(url), what=f"Redis at {mask(url)}")
        """The bound on this store's commands in flight (see ``stores._gate``)."""
        self.client: Any = client(factory_for(url, cluster, blocking=False), url, pool_max)
        self._lane = _Lane()
        """The single server's lane."""
        self._node_lanes: dict[str, _Lane] = {}
        """A lane per Redis Cluster node, by node name."""
        self._retired_lanes: list[_Lane] = []
        """Lanes to nodes that a topology refresh replaced."""
        self._poppers: list[Any] = []
        """Idle connections that queued waiters BLPOP on (single server)."""

    async def warm_up(self) -> None:
        with contextlib.suppress(*DRIVER_ERRORS):
            if self.cluster:
                await self.client.initialize()  # the slot map and a connection per node
            else:
                await self.client.ping()

    async def aclose(self) -> None:
        for lane in (self._lane, *self._node_lanes.values(), *self._retired_lanes):
            await self._drop_lane(lane)
        while self._poppers:
            await self.client.connection_pool.release(self._poppers.pop())
        await self.client.aclose()
        await sentinel.aclose_sentinels(self.client)

    async def call(self, method: str, *args: Any) -> Any:
        """A redis-py command, in a turn of the gate."""
        before = cancel_requests()
        with self.translated:
            async with self.gate:
                answer = await getattr(self.client, method)(*args)
        raise_swallowed_cancel(before)
        return answer

    async def script(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """One script call: on its lane when free, else through the pool.

        EVALSHA, pre-encoded, on the lane. Its first attempt is made right
        here, a coroutine level under the store's method (every uncontended
        lock call takes this path); a failure goes to :meth:`_lane_failed`.
        """
        before = cancel_requests()
        async with self.gate:
            lane = self._node_lane(keys[0]) if self.cluster else self._lane
            if lane is None or lane.busy:
                return await self._via_pool(name, keys, args)
            lane.busy = True
            try:
                with self.translated:
                    try:
                        answer = await self._lane_attempt(lane, name, keys, args)
                    except Exception as exc:
                        answer = await self._lane_failed(exc, lane, name, keys, args)
            finally:
                lane.busy = False
        # The script ran (its answer was read): the caller's cancellation
        # path gives back what it obtained.
        raise_swallowed_cancel(before)
        return answer

    async def _loaded(
        self, name: str, call: Callable[[], Awaitable[T]], missing: NoScriptError | None = None
    ) -> T:
        """``await call()``; once more after loading the script if the server did
        not know it (it restarted or flushed its script cache). ``missing``:
        the first call was already made and raised it."""
        if missing is None:
            try:
                return await call()
            except NoScriptError:
                pass
        await self.client.script_load(SOURCES[name])
        return await call()

    async def _via_pool(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        before = cancel_requests()
        with self.translated:
            answer = await self._loaded(
                name, lambda: self.client.evalsha(SHAS[name], len(keys), *keys, *args)
            )
        raise_swallowed_cancel(before)
        return answer

    def _node_lane(self, key: str) -> _Lane | None:
        """The lane to the Redis Cluster node that serves ``key``; None before the
        client has its slot map (the general path loads it)."""
        try:
            node = self.client.get_node_from_key(key)
        except DRIVER_ERRORS:
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

    async def _lane_failed(
        self,
        exc: Exception,
        lane: _Lane,
        name: str,
        keys: Sequence[str],
        args: Sequence[str | int | float],
    ) -> Any:
        """The lane's first attempt raised ``exc``. A script the server does not
        know is loaded and sent again. Then, on a single server, a broken
        connection is retried once (the stores' policy); on a cluster, a node
        that did not run it (a redirect, a node that cannot serve) and a broken
        connection go to the general path, which follows the cluster's new
        shape. Anything else is raised."""
        again = functools.partial(self._lane_attempt, lane, name, keys, args)
        if isinstance(exc, NoScriptError):
            try:
                return await self._loaded(name, again, exc)
            except Exception as second:
                exc = second
        if lane.node is None:
            return await once_more(exc, functools.partial(self._loaded, name, again), broken)
        if isinstance(exc, (*NOT_SERVED_HERE, RedisConnectionError)):
            return await self._via_pool(name, keys, args)
        raise exc

    async def _lane_attempt(
        self, lane: _Lane, name: str, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        try:
            conn = lane.conn
            if conn is not None and lane.node is not None and conn.should_reconnect():
                # redis-py marks a cluster's connections after a topology
                # change (a node's role may have changed): a new one.
                await self._drop_lane(lane)
                conn = None
            if conn is None:
                conn = await self._lane_connection(lane)
            await conn.send_packed_command(evalsha(name, keys, args), check_health=False)
            return await conn.read_response()
        except (*NOT_SERVED_HERE, ResponseError):
            raise  # an answer: the connection itself is fine
        except BaseException:
            # A timeout or a cancellation may leave a reply unread: the
            # connection is given up, and a new one is taken next time.
            await self._drop_lane(lane)
            raise

    async def _lane_connection(self, lane: _Lane) -> Any:
        if lane.node is not None:
            lane.conn = lane.node.acquire_connection()  # no I/O: it connects at its first write
        else:
            before = cancel_requests()
            lane.conn = await self.client.connection_pool.get_connection()
            # On the lane before the check: a cancellation raised here leaves the
            # connection to _drop_lane, which gives it back to the pool.
            raise_swallowed_cancel(before)
        return lane.conn

    async def _drop_lane(self, lane: _Lane) -> None:
        conn, lane.conn = lane.conn, None
        if conn is None:
            return
        try:
            with contextlib.suppress(*DRIVER_ERRORS):
                await conn.disconnect(nowait=True)
        finally:  # given back even when a cancellation interrupts the disconnect
            if lane.node is not None:
                lane.node.release(conn)
            else:
                await self.client.connection_pool.release(conn)

    async def scripts(self, calls: Calls) -> list[Any]:
        """Many script calls, each atomic on its own: pipelined on a single
        server (one round trip). On a cluster they go at once, each on the
        lane of its node: redis-py's cluster pipeline would try a timed-out
        batch again, past the store's timeout."""
        if not calls:
            return []
        if self.cluster:
            answers = await asyncio.gather(
                *(self.script(name, keys, args) for name, keys, args in calls),
                return_exceptions=True,
            )
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise answer
            return answers
        with self.translated:
            async with self.gate:
                before = cancel_requests()
                answers = await self._pipelined(range(len(calls)), calls)
                raise_swallowed_cancel(before)
        for answer in answers:
            if isinstance(answer, Exception):
                raise self.translated.unavailable(answer) from answer
        return answers

    async def _pipelined(self, indices: Sequence[int], calls: Calls) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for i in indices:
            name, keys, args = calls[i]
            pipe.evalsha(SHAS[name], len(keys), *keys, *args)
        answers: list[Any] = list(await pipe.execute(raise_on_error=False))
        unknown = [
            i
            for i, answer in zip(indices, answers, strict=True)
            if isinstance(answer, NoScriptError)
        ]
        if unknown:  # the server restarted or flushed its script cache: those did not run
            for name in sorted({calls[i][0] for i in unknown}):
                await self.client.script_load(SOURCES[name])
            again = iter(await self._pipelined(unknown, calls))
            answers = [next(again) if isinstance(a, NoScriptError) else a for a in answers]
        return answers

    async def pop(self, key: str, timeout: float) -> bytes | None:
        """BLPOP one item from ``key``, waiting up to ``timeout`` seconds; None if none came.

        On a single server, pre-encoded on a connection of its own, as a lane
        is: the item is read the moment it lands. Waiting connections are kept
        for the next wait rather than given back to the pool, whose release
        would stand between the item and the waiter.
        """
        seconds = f"{max(timeout, 0.001):.3f}"
        before = cancel_requests()
        with self.translated:
            if self.cluster:
                answer = await self.client.blpop([key], float(seconds))
                raise_swallowed_cancel(before)
                return None if answer is None else answer[1]
            pool = self.client.connection_pool
            conn = self._poppers.pop() if self._poppers else await pool.get_connection()
            try:
                raise_swallowed_cancel(before)  # (taking a pooled connection)
                await conn.send_packed_command(packed(b"BLPOP", key, seconds), check_health=False)
                raise_swallowed_cancel(before)  # (rather than block while cancelled)
                answer = await conn.read_response(timeout=timeout + 2.0)
            except BaseException:
                # A timeout or a cancellation may leave the reply unread.
                with contextlib.suppress(*DRIVER_ERRORS):
                    await conn.disconnect(nowait=True)
                await pool.release(conn)
                raise
            self._poppers.append(conn)
        raise_swallowed_cancel(before)  # the reply was read: the connection is kept
        return None if answer is None else answer[1]
