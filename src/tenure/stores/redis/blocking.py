"""The Redis store's acquire and release as plain calls, for blocking callers (``tenure.sync``).

They go through redis-py's blocking client on the caller's thread, with the
same scripts, keys and answers as the store's coroutines (which serve
everything else: waiters on the API's loop thread, and the renewer), and the
same paths: pre-encoded on idle connections of the store's own (on a cluster,
per node, with the same fallback to the general path), the same retry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry as BlockingRetry

from .._errors import Translated
from .._gate import Gate
from .._retry import once_more_now
from ..base import BlockingLeases, Grant
from .scripts import SHAS, SOURCES, Keys, evalsha
from .sentinel import close_sentinels, said
from .transport import DRIVER_ERRORS, NOT_SERVED_HERE, broken, client, factory_for

__all__ = ("BlockingCalls",)

T = TypeVar("T")


class BlockingCalls(BlockingLeases):
    """Acquire and release on the caller's thread (see the module docstring).

    Any thread may call: each call takes a connection off an idle list
    (``list.pop`` and ``append`` are atomic), or a new one from the pool, and
    puts it back after reading its reply.
    """

    def __init__(self, url: str, *, cluster: bool, pool_max: int, keys: Keys, gate: Gate) -> None:
        self.cluster = cluster
        self.keys = keys
        self.gate = gate
        """The store's gate: blocking and asyncio calls share one bound."""
        self.translated = Translated(DRIVER_ERRORS, gate.what, said)
        factory = factory_for(url, cluster, blocking=True)
        self.client: Any = client(factory, url, pool_max, BlockingRetry)
        self._idle: list[Any] = []
        """Idle connections (single server)."""
        self._node_idle: dict[str, tuple[Any, list[Any]]] = {}
        """Per Redis Cluster node (by name): its connection pool and our idle connections."""

    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        fence = self._script("acquire", *self.keys.acquire(name, token, ttl, holder))
        return None if fence is None else Grant(int(fence))

    def release(self, name: str, token: str) -> bool:
        return bool(self._script("release", *self.keys.release(name, token)))

    def close(self) -> None:
        while self._idle:
            self.client.connection_pool.release(self._idle.pop())
        for pool, idle in self._node_idle.values():
            while idle:
                pool.release(idle.pop())
        self.client.close()
        close_sentinels(self.client)

    def _script(self, name: str, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        # The translation as an except clause, not ``with self.translated``: this
        # is the blocking hot path, and a second context manager costs a call each way.
        with self.gate.blocking():
            try:
                if not self.cluster:
                    # The first attempt inline, the retry policy only after a failure.
                    pool = self.client.connection_pool
                    try:
                        return self._on_lane(pool, self._idle, name, keys, args)
                    except Exception as exc:
                        again = functools.partial(self._on_lane, pool, self._idle, name, keys, args)
                        return once_more_now(exc, again, broken)
                lane = self._node_lane(keys[0])
                if lane is not None:
                    try:
                        return self._on_lane(*lane, name, keys, args)
                    except (*NOT_SERVED_HERE, RedisConnectionError):
                        pass  # it did not run there, or the node went: the general way follows
                return self._loaded(
                    name, lambda: self.client.evalsha(SHAS[name], len(keys), *keys, *args)
                )
            except DRIVER_ERRORS as exc:
                raise self.translated.unavailable(exc) from exc

    def _loaded(self, name: str, call: Callable[[], T], missing: NoScriptError | None = None) -> T:
        """``call()``; once more after loading the script if the server did not
        know it (it restarted or flushed its script cache). ``missing``: the
        first call was already made and raised it."""
        if missing is None:
            try:
                return call()
            except NoScriptError:
                pass
        self.client.script_load(SOURCES[name])
        return call()

    def _node_lane(self, key: str) -> tuple[Any, list[Any]] | None:
        """The connection pool of the cluster node that serves ``key``, with our
        idle connections to it; None when redis-py has none yet."""
        try:
            node = self.client.get_node_from_key(key)
        except DRIVER_ERRORS:
            return None
        node_client = None if node is None else node.redis_connection
        if node_client is None:
            return None
        pool = node_client.connection_pool
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
    ) -> Any:
        """EVALSHA, pre-encoded, on an idle connection of ours."""
        try:
            conn = idle.pop()
        except IndexError:  # none idle (another thread may just have taken the last)
            conn = pool.get_connection()
        try:
            try:
                conn.send_packed_command([evalsha(name, keys, args)], check_health=False)
                answer = conn.read_response()
            except NoScriptError as missing:
                again = functools.partial(_send, conn, name, keys, args)
                answer = self._loaded(name, again, missing)
        except ResponseError:
            idle.append(conn)  # an answer: the connection itself is fine
            raise
        except BaseException:
            # A timeout or an interruption may leave a reply unread.
            conn.disconnect()
            pool.release(conn)
            raise
        idle.append(conn)
        return answer


def _send(conn: Any, name: str, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
    """EVALSHA, pre-encoded, on ``conn``; its reply."""
    conn.send_packed_command([evalsha(name, keys, args)], check_health=False)
    return conn.read_response()
