"""How the etcd store's calls reach the cluster: channel, authentication, failover, retry.

The driver is gRPC, through the protocol classes that ``aetcd`` generates from
etcd's own ``.proto`` files (``tenure[etcd]``); the channel, authentication,
failover and keep-alives are this module's, since aetcd's client offers no TLS.

* One channel per event loop (gRPC's asyncio channels belong to one loop).
* At most ``in_flight_max`` calls at once (the ``gate``); further callers
  queue for a turn, first come, first served.
* Timeouts are the event loop's (monotonic), not gRPC's: gRPC's Python layer
  turns a timeout into a wall-clock deadline, which a clock step would move.
* Failover: a call that times out or finds its member unavailable fails
  closed (StoreUnavailable) and makes the next call open a channel to the
  next member of the URL first; etcd forwards writes to the leader.
* Retry: the stores' one policy. A call whose connection broke
  (UNAVAILABLE, INTERNAL) or whose auth token expired is sent once more on a
  new one, never one that timed out: every call here is safe to repeat (an
  acquire or a claim that was applied the first time recognizes itself the
  second time).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import weakref
from collections.abc import Sequence
from typing import Any

import grpc
from aetcd import rpc
from aetcd.watcher import Watcher

from ...errors import ConfigurationError, StoreUnavailable
from .._gate import Gate
from .._retry import retried
from .waiting import Releases

__all__ = ("Conn", "Transport")


class Conn:
    """One gRPC channel and its stubs, for one event loop."""

    def __init__(self, channel: Any, metadata: Any) -> None:
        self.channel = channel
        self.metadata = metadata
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watcher = Watcher(rpc.WatchStub(channel), metadata=metadata)
        self.broken = False
        self.releases = Releases()
        """Deletions of lock keys (lock waiters)."""
        self.freed = Releases(end=b"\x1f")
        """Deletions of semaphore keys (semaphore waiters)."""


class _Broken(Exception):
    """A call's connection broke, or another caller closed it under the call:
    safe to send once more."""

    def __init__(self, conn: Conn, error: BaseException | None) -> None:
        super().__init__(str(error))
        self.conn = conn
        self.error = error
        """The gRPC error; None when the channel was closed under the call."""


class Transport:
    """The connection paths of one store (see the module docstring)."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        where: str,
        timeout: float,
        in_flight_max: int,
        username: str | None,
        password: str | None,
        tls: bool,
        ca: bytes | None,
        cert: bytes | None,
        key: bytes | None,
        pid: int,
    ) -> None:
        self.endpoints = list(endpoints)
        self.where = where
        self.timeout = timeout
        self.username = username
        self._password = password
        self.tls = tls
        self._ca, self._cert, self._key = ca, cert, key
        self.pid = pid
        """The process that opened the store: gRPC does not survive a fork."""
        self.gate = Gate(in_flight_max, timeout, what=where, option="in_flight_max")
        """The bound on this store's calls in flight (see ``stores._gate``)."""
        self._conns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Conn] = (
            weakref.WeakKeyDictionary()
        )
        self._first = 0  # the member to try first: moves on when one fails

    def target(self) -> tuple[str, list[tuple[str, Any]]]:
        order = self.endpoints[self._first :] + self.endpoints[: self._first]
        options: list[tuple[str, Any]] = [
            ("grpc.lb_policy_name", "pick_first"),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.enable_retries", 0),
            # A channel made to replace a broken one must open its own
            # connection, not reuse the broken one from gRPC's global pool.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        addresses = []
        for host, _ in order:
            try:
                addresses.append(ipaddress.ip_address(host))
            except ValueError:
                break
        versions = {address.version for address in addresses}
        if len(addresses) == len(order) and len(versions) == 1:
            # gRPC's own list of addresses: pick_first tries them in this order.
            listed = ",".join(
                f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
                for address, (_, port) in zip(addresses, order, strict=True)
            )
            return f"ipv{versions.pop()}:{listed}", options
        # Host names: gRPC resolves one name per channel; the first one is used
        # and the others are tried in turn when it fails.
        host, port = order[0]
        if self.tls:
            options.append(("grpc.ssl_target_name_override", host))
        return f"dns:///{host}:{port}", options

    async def conn(self) -> Conn:
        if os.getpid() != self.pid:
            # gRPC's core does not survive os.fork() once it has run: a channel
            # made in the child crashes the process instead of failing.
            raise ConfigurationError(
                "an etcd LockService cannot be used in a process forked from the one "
                "that opened it (gRPC does not survive fork); open the LockService "
                "after the fork instead, e.g. in gunicorn's post_fork or Celery's "
                "worker_process_init"
            )
        loop = asyncio.get_running_loop()
        conn = self._conns.get(loop)
        if conn is not None and not conn.broken:
            return conn
        if conn is not None:
            self._conns.pop(loop, None)
            # They look again, on the new connection.
            conn.releases.wakeups.wake_all()
            conn.freed.wakeups.wake_all()
            with contextlib.suppress(Exception):
                await conn.watcher.shutdown()
                await conn.channel.close()
        target, options = self.target()
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self._ca,
                private_key=self._key,
                certificate_chain=self._cert,
            )
            channel = grpc.aio.secure_channel(target, credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        metadata = None
        if self.username is not None:
            try:
                async with asyncio.timeout(self.timeout):
                    answer = await rpc.AuthStub(channel).Authenticate(
                        rpc.AuthenticateRequest(name=self.username, password=self._password)
                    )
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                await channel.close()
                raise self.failed(None, exc) from exc
            metadata = (("token", answer.token),)
        conn = Conn(channel, metadata)
        self._conns[loop] = conn
        return conn

    def failed(self, conn: Conn | None, exc: Exception) -> StoreUnavailable:
        """The error for a failed call; a member that timed out or went away
        makes the next call start from the next member of the URL."""
        if isinstance(exc, grpc.aio.AioRpcError):
            code, details = exc.code().name, exc.details()
        else:
            code, details = "DEADLINE_EXCEEDED", f"no answer within {self.timeout:g} s"
        if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL"):
            if conn is not None:
                conn.broken = True
            if len(self.endpoints) > 1:
                self._first = (self._first + 1) % len(self.endpoints)
        error = StoreUnavailable(f"{self.where} failed: {code}: {details}")
        error.__cause__ = exc
        return error

    async def call(self, method: str, stub: str, request: Any) -> Any:
        """One unary call; driver errors become StoreUnavailable. An expired
        auth token is renewed once, and a call whose connection broke
        (UNAVAILABLE, INTERNAL) is sent once more on a new one, never one that
        timed out: every call here is safe to repeat (an acquire or a claim
        that was applied the first time recognizes itself the second time).

        The timeout is the event loop's (monotonic), not gRPC's: gRPC's Python
        layer turns a timeout into a wall-clock deadline, which a clock step
        would move."""
        async with self.gate:
            return await self._call_in_turn(method, stub, request)

    async def _call_in_turn(self, method: str, stub: str, request: Any) -> Any:
        try:
            return await retried(lambda: self._attempt(method, stub, request), _broken)
        except _Broken as exc:
            if not isinstance(exc.error, grpc.aio.AioRpcError):
                closed = "its connection was closed while the call was on it"
                raise StoreUnavailable(f"{self.where} failed: {closed}") from None
            raise self.failed(exc.conn, exc.error) from exc.error

    async def _attempt(self, method: str, stub: str, request: Any) -> Any:
        conn = await self.conn()
        try:
            async with asyncio.timeout(self.timeout):
                return await getattr(getattr(conn, stub), method)(request, metadata=conn.metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL) or (
                code == grpc.StatusCode.UNAUTHENTICATED and "token" in exc.details()
            ):
                conn.broken = True
                raise _Broken(conn, exc) from exc
            raise self.failed(conn, exc) from exc
        except TimeoutError as exc:
            raise self.failed(conn, exc) from exc
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            # Not this task's cancel: another caller found the channel
            # broken and closed it, which cancels every call on it.
            raise _Broken(conn, None) from None

    async def keep_alive(self, lease_id: int) -> int:
        """One keep-alive; the TTL etcd now gives the lease (<= 0: it is gone)."""
        conn = await self.conn()
        call = conn.lease.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), metadata=conn.metadata
        )
        try:
            async with asyncio.timeout(self.timeout):
                async for answer in call:
                    return int(answer.TTL)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            raise self.failed(conn, exc) from exc
        finally:
            call.cancel()
        raise StoreUnavailable(f"{self.where} ended a keep-alive without answer")

    async def warm_up(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.conn()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        conns, self._conns = dict(self._conns), weakref.WeakKeyDictionary()
        for owner, conn in conns.items():
            if owner is loop:  # a channel can only be closed on its own loop
                with contextlib.suppress(Exception):
                    await conn.watcher.shutdown()
                await conn.channel.close()


def _broken(exc: BaseException) -> bool:
    return isinstance(exc, _Broken)
