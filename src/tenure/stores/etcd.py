"""etcd: leases in a consensus store, the one store whose grants survive the loss of a server.

URL: ``etcd://[user:password@]host:port[,host:port...][?options]``. Options:
``prefix`` (key prefix, default ``tenure``), ``timeout`` (seconds per call,
default 2, and seconds a call may queue for its turn), ``in_flight_max``
(calls sent at once on the store's one channel, default 64: further callers
queue for a turn, first come, first served), ``tls`` (true/false), ``ca``,
``cert``, ``key`` (PEM files; ``ca`` alone verifies the server, ``cert`` +
``key`` add a client certificate).

The driver is gRPC, through the protocol classes that ``aetcd`` generates from
etcd's own ``.proto`` files (``tenure[etcd]``); the channel, authentication,
failover and keep-alives are this module's, since aetcd's client offers no TLS.

Keys (``P`` is the prefix, ``N`` the lock name)::

    P/lock/N     the holder's display id (JSON); its create revision is the fencing token
    P/token/N    sha256 of the grant's secret token: what release and renewal compare
    P/claim/T    the last claimed occurrence of task T (fixed-width µs, so bytes order = time order)
    P/run/T\\0S/R one run record of task T, started at S (fixed-width µs), run id R

* **Acquire** is one transaction guarded on ``P/lock/N`` not existing; both keys
  are attached to an etcd lease. Its revision is the fencing token: strictly
  increasing, cluster-wide, and durable (it survives restarts of every member).
  etcd's own v3lock ``Lock`` RPC is not used: it is a wait queue that returned
  without re-checking the lease (Jepsen's etcd 3.4.3 analysis).
* **Shared leases.** All locks of one store with the same TTL share one etcd
  lease, so one keep-alive renews them all. A lock's lease is renewed on every
  acquire too (sent beside the transaction, so no extra wait): the lease then
  outlives the acquire's send time plus the TTL, which is what the holder's
  local deadline assumes. A lease that etcd reports expired marks every lock on
  it lost.
* **Renewal** is, per lease, a keep-alive and a ``LeaseTimeToLive`` that lists
  the keys still attached to it, sent together: a lock whose token key left its
  lease (released elsewhere, or forced free by an operator) is reported lost.
  A key on the lease that no lock of this process owns (an acquire whose answer
  was lost) is deleted, so a shared lease never keeps a stranger alive.
* **Release** is a transaction comparing ``P/token/N`` with the token's digest.
* **Waiters** watch ``P/lock/N`` for its deletion from the revision at which
  they saw it held, so a release between that look and the watch is not missed;
  a lease expiry deletes the key too.
* **TTL granularity.** etcd counts lease TTLs in whole seconds and raises any
  TTL below its minimum (1.5x the election timeout: 2 s with etcd's defaults):
  a crashed holder's lock frees within that, while its holder still gives it up
  at its own, shorter local deadline.
* **Failover.** A call that times out or finds its member unavailable fails
  closed (StoreUnavailable) and makes the next call open a channel to the next
  member of the URL first; etcd forwards writes to the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import math
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote

import grpc
from aetcd import rpc
from aetcd.exceptions import RevisionCompactedError
from aetcd.rtypes import Event, EventKind
from aetcd.watcher import Watcher

from .._aio import woken_within
from ..errors import ConfigurationError, StoreUnavailable
from ._gate import Gate
from ._options import check_pool_max, mask, number
from ._waiters import Wakeups
from .base import AcquireItem, Grant, LeaseInfo, ReleaseItem, RenewItem, Store
from .runlog import Claim, RunLog, RunOutcome, RunRecord

__all__ = ("EtcdStore",)

IN_FLIGHT_MAX = 64
"""Calls a store sends at once on its channel by default (``in_flight_max``)."""
_MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
_SEEN_MAX = 10_000  # contended names remembered for a wait that may follow
_TRIM_SEEN = 4
"""Oldest run-record keys read per task when trimming after a batch."""


def _prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def _micros(seconds: float) -> bytes:
    return b"%020d" % round(seconds * 1e6)


def _delete(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def _read(key: bytes) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def _is(key: bytes, target: str, **compared: Any) -> Any:
    """A transaction's condition: ``target`` (CREATE, VALUE, LEASE) of ``key`` equals."""
    return rpc.Compare(
        key=key, target=getattr(rpc.Compare, target), result=rpc.Compare.EQUAL, **compared
    )


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).hexdigest().encode()


@dataclass
class _Lease:
    id: int
    valid_until: float
    """Monotonic time before which etcd surely still has it (from the send
    time of the last confirmed grant or keep-alive)."""


@dataclass
class _Shared:
    """What a store and its siblings (other threads' loops) share."""

    guard: threading.Lock = field(default_factory=threading.Lock)
    pid: int = field(default_factory=os.getpid)
    leases: dict[float, _Lease] = field(default_factory=dict)
    owned: dict[str, tuple[str, int]] = field(default_factory=dict)
    """token -> (name, lease id): registered before the acquire is sent."""


class _Conn:
    """One gRPC channel and its stubs, for one event loop."""

    def __init__(self, channel: Any, metadata: Any) -> None:
        self.channel = channel
        self.metadata = metadata
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watcher = Watcher(rpc.WatchStub(channel), metadata=metadata)
        self.broken = False
        self.releases = _Releases()


class _Releases:
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
        if len(self.deleted) >= _SEEN_MAX:
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


class EtcdStore(Store, RunLog):
    """Leases in an etcd cluster. See the module docstring."""

    gate: Gate

    scheme: ClassVar[str] = "etcd"

    @property
    def runlog(self) -> RunLog:
        return self

    @property
    def leases(self) -> Store:
        return self

    # A nested transaction's operations count against what its parent leaves
    # of --max-txn-ops (128 by default): 126 items, each a transaction of at
    # most two operations a level, fill one.
    batch_max: ClassVar[int] = _MAX_TXN_OPS - 2

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str = "tenure",
        timeout: float = 2.0,
        in_flight_max: int = IN_FLIGHT_MAX,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        ca: bytes | None = None,
        cert: bytes | None = None,
        key: bytes | None = None,
        _shared: _Shared | None = None,
    ) -> None:
        if not endpoints:
            raise ConfigurationError("an etcd URL needs at least one host:port")
        if not prefix or "\0" in prefix:
            raise ConfigurationError(f"etcd key prefix must be a non-empty string, got {prefix!r}")
        if not (0 < timeout <= 600):
            raise ConfigurationError(f"timeout must be between 0 and 600 seconds, got {timeout!r}")
        if (username is None) != (password is None):
            raise ConfigurationError(
                "an etcd URL needs both a user name and a password, or neither"
            )
        if (cert is None) != (key is None):
            raise ConfigurationError("etcd client certificates need both cert= and key=")
        self.endpoints = list(endpoints)
        self.prefix = prefix
        self.timeout = timeout
        self.in_flight_max = check_pool_max(in_flight_max, "in_flight_max")
        self.username = username
        self.gate = Gate(
            in_flight_max, timeout, what=f"etcd at {self.describe()}", option="in_flight_max"
        )
        """The bound on this store's calls in flight (see ``stores._gate``)."""
        self._password = password
        self.tls = tls or ca is not None or cert is not None
        self._ca, self._cert, self._key = ca, cert, key
        self._shared = _Shared() if _shared is None else _shared
        self._conns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Conn] = (
            weakref.WeakKeyDictionary()
        )
        self._first = 0  # the member to try first: moves on when one fails
        self._seen: dict[str, int] = {}  # name -> revision at which an acquire saw it held
        p = prefix.encode()
        self._lock_prefix = p + b"/lock/"
        self._token_prefix = p + b"/token/"
        self._claim_prefix = p + b"/claim/"
        self._run_prefix = p + b"/run/"

    # -- URL, identity, connections --------------------------------------------

    @classmethod
    def from_url(cls, url: str) -> EtcdStore:
        rest = url.split("://", 1)[1] if "://" in url else ""
        netloc, _, query = rest.partition("?")
        netloc = netloc.rstrip("/")
        username = password = None
        if "@" in netloc:
            credentials, netloc = netloc.rsplit("@", 1)
            user, sep, secret = credentials.partition(":")
            username = unquote(user)
            password = unquote(secret) if sep else None
        endpoints = []
        for part in netloc.split(","):
            host, sep, port = part.rpartition(":")
            if not sep or not port.isdigit() or not host or not (0 < int(port) < 65536):
                raise ConfigurationError(
                    f"etcd endpoint {part!r} in {mask(url)!r} is not host:port"
                )
            endpoints.append((host.strip("[]"), int(port)))
        options: dict[str, Any] = {}
        files: dict[str, bytes] = {}
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name == "prefix":
                options["prefix"] = value
            elif name == "timeout":
                options["timeout"] = number("etcd", name, value, float)
            elif name == "in_flight_max":
                options["in_flight_max"] = number("etcd", name, value, int)
            elif name == "tls":
                if value.lower() not in ("true", "yes", "1", "false", "no", "0"):
                    raise ConfigurationError(f"tls must be true or false, got {value!r}")
                options["tls"] = value.lower() in ("true", "yes", "1")
            elif name in ("ca", "cert", "key"):
                try:
                    files[name] = Path(value).read_bytes()
                except OSError as exc:
                    raise ConfigurationError(
                        f"cannot read the etcd {name} file {value!r}: {exc.strerror}"
                    ) from None
            else:
                raise ConfigurationError(
                    "unknown etcd URL option "
                    f"{name!r}; known: prefix, timeout, in_flight_max, tls, ca, cert, key"
                )
        return cls(
            endpoints,
            username=username,
            password=password,
            ca=files.get("ca"),
            cert=files.get("cert"),
            key=files.get("key"),
            **options,
        )

    def describe(self) -> str:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.endpoints)
        user = f"{self.username}:***@" if self.username is not None else ""
        return f"etcd://{user}{hosts}"

    def sibling(self) -> EtcdStore:
        # gRPC's asyncio channels belong to one loop; the leases and the
        # registry of owned tokens are shared.
        return EtcdStore(
            self.endpoints,
            prefix=self.prefix,
            timeout=self.timeout,
            in_flight_max=self.in_flight_max,
            username=self.username,
            password=self._password,
            tls=self.tls,
            ca=self._ca,
            cert=self._cert,
            key=self._key,
            _shared=self._shared,
        )

    def _target(self) -> tuple[str, list[tuple[str, Any]]]:
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

    async def _conn(self) -> _Conn:
        if os.getpid() != self._shared.pid:
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
            conn.releases.wakeups.wake_all()  # they look again, on the new connection
            with contextlib.suppress(Exception):
                await conn.watcher.shutdown()
                await conn.channel.close()
        target, options = self._target()
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=self._ca, private_key=self._key, certificate_chain=self._cert
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
                raise self._failed(None, exc) from exc
            metadata = (("token", answer.token),)
        conn = _Conn(channel, metadata)
        self._conns[loop] = conn
        return conn

    def _failed(self, conn: _Conn | None, exc: Exception) -> StoreUnavailable:
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
        error = StoreUnavailable(f"etcd at {self.describe()} failed: {code}: {details}")
        error.__cause__ = exc
        return error

    async def _call(self, method: str, stub: str, request: Any) -> Any:
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
        for attempt in (1, 2):
            conn = await self._conn()
            try:
                async with asyncio.timeout(self.timeout):
                    return await getattr(getattr(conn, stub), method)(
                        request, metadata=conn.metadata
                    )
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if attempt == 1 and (
                    code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
                    or (code == grpc.StatusCode.UNAUTHENTICATED and "token" in exc.details())
                ):
                    conn.broken = True
                    continue
                raise self._failed(conn, exc) from exc
            except TimeoutError as exc:
                raise self._failed(conn, exc) from exc
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                # Not this task's cancel: another caller found the channel
                # broken and closed it, which cancels every call on it.
                if attempt == 2:
                    raise StoreUnavailable(
                        f"etcd at {self.describe()} failed: its connection was closed "
                        "while the call was on it"
                    ) from None
        raise AssertionError("unreachable")

    async def warm_up(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self._conn()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        conns, self._conns = dict(self._conns), weakref.WeakKeyDictionary()
        for owner, conn in conns.items():
            if owner is loop:  # a channel can only be closed on its own loop
                with contextlib.suppress(Exception):
                    await conn.watcher.shutdown()
                await conn.channel.close()

    # -- leases ----------------------------------------------------------------

    async def _lease_for(self, ttl: float) -> _Lease:
        with self._shared.guard:
            lease = self._shared.leases.get(ttl)
        # A lease past its known lifetime may be gone; a fresh one costs a
        # round trip only then.
        if lease is not None and lease.valid_until > time.monotonic():
            return lease
        sent = time.monotonic()
        answer = await self._call(
            "LeaseGrant", "lease", rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))
        )
        if answer.error:
            raise StoreUnavailable(f"etcd at {self.describe()} refused a lease: {answer.error}")
        # etcd grants at least the TTL asked for, in whole seconds.
        lease = _Lease(int(answer.ID), sent + int(answer.TTL))
        with self._shared.guard:
            self._shared.leases[ttl] = lease
        return lease

    async def _keep_alive(self, lease_id: int) -> int:
        """One keep-alive; the TTL etcd now gives the lease (<= 0: it is gone)."""
        conn = await self._conn()
        call = conn.lease.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), metadata=conn.metadata
        )
        try:
            async with asyncio.timeout(self.timeout):
                async for answer in call:
                    return int(answer.TTL)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            raise self._failed(conn, exc) from exc
        finally:
            call.cancel()
        raise StoreUnavailable(f"etcd at {self.describe()} ended a keep-alive without answer")

    def _disown(self, token: str) -> None:
        """Stop counting ``token`` as held or being acquired here (``_sweep`` may take its keys)."""
        with self._shared.guard:
            self._shared.owned.pop(token, None)

    def _forget_lease(self, lease_id: int) -> None:
        with self._shared.guard:
            for ttl, known in list(self._shared.leases.items()):
                if known.id == lease_id:
                    del self._shared.leases[ttl]

    # -- locks -----------------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        return (await self._acquire_together([AcquireItem(name, token, ttl, holder)]))[0]

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
        lock_key = self._lock_prefix + item.name.encode()
        token_key = self._token_prefix + item.name.encode()
        value = json.dumps({"holder": item.holder, "at": time.time()}).encode()
        return rpc.RequestOp(
            request_txn=rpc.TxnRequest(
                compare=[_is(lock_key, "CREATE", create_revision=0)],
                success=[
                    rpc.RequestOp(
                        request_put=rpc.PutRequest(key=lock_key, value=value, lease=lease_id)
                    ),
                    rpc.RequestOp(
                        request_put=rpc.PutRequest(
                            key=token_key, value=_digest(item.token), lease=lease_id
                        )
                    ),
                ],
                # Held: by whom? (Ourselves, when this is a resend of an
                # acquire that was applied but whose answer was lost.)
                failure=[_read(lock_key), _read(token_key)],
            )
        )

    async def _acquire_together(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        """Acquires of one TTL (distinct names) in one transaction, on one shared lease."""
        ttl = items[0].ttl
        for _attempt in (1, 2):
            lease = await self._lease_for(ttl)
            with self._shared.guard:
                for item in items:
                    self._shared.owned[item.token] = (item.name, lease.id)
            txn = rpc.TxnRequest(success=[self._acquire_txn(item, lease.id) for item in items])
            sent = time.monotonic()
            # The keep-alive travels beside the transaction: granted, the lease
            # then outlives sent + TTL, as the holder's local deadline assumes.
            answers = await asyncio.gather(
                self._call("Txn", "kv", txn), self._keep_alive(lease.id), return_exceptions=True
            )
            answer, alive = answers
            if isinstance(answer, BaseException):
                for item in items:
                    self._disown(item.token)
                if isinstance(answer, StoreUnavailable) and "lease not found" in str(answer):
                    self._forget_lease(lease.id)
                    continue
                raise answer
            grants = self._granted(items, answer)
            if isinstance(alive, BaseException) or alive <= 0:
                if not isinstance(alive, BaseException):
                    self._forget_lease(lease.id)  # expired under us: the keys went with it
                    for item in items:
                        self._disown(item.token)
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
            with self._shared.guard:
                # Any older token of ours for these names is lost: its key was gone.
                for other, (other_name, _) in list(self._shared.owned.items()):
                    if granted.get(other_name, other) != other:
                        del self._shared.owned[other]
            return grants
        raise StoreUnavailable(f"etcd at {self.describe()} expired two leases in a row")

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
            if held_by and held_by[0].value == _digest(item.token):
                grants.append(Grant(int(inner.responses[0].response_range.kvs[0].create_revision)))
                continue
            self._disown(item.token)
            if len(self._seen) >= _SEEN_MAX:  # acquires that never waited
                self._seen.clear()
            self._seen[item.name] = revision
            grants.append(None)
        return grants

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        with self._shared.guard:
            where = [self._shared.owned.get(item.token) for item in batch]
            leases = {lease.id: lease for lease in self._shared.leases.values()}
        lease_ids = sorted({entry[1] for entry in where if entry is not None})
        sent = time.monotonic()
        calls = []
        for lease_id in lease_ids:
            calls.append(self._keep_alive(lease_id))
            calls.append(
                self._call(
                    "LeaseTimeToLive", "lease", rpc.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
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
                self._forget_lease(lease_id)
        results = []
        for item, entry in zip(batch, where, strict=True):
            keys = alive.get(entry[1]) if entry is not None else None
            ok = keys is not None and self._token_prefix + item.name.encode() in keys
            if not ok:  # lost for good: the holder is told, and nothing renews it again
                self._disown(item.token)
            results.append(ok)
        await self._sweep(alive)
        return results

    async def _sweep(self, alive: dict[int, set[bytes]]) -> None:
        """Delete keys on our leases that no lock of ours owns (an acquire whose
        answer was lost): a shared lease must not keep them alive."""
        with self._shared.guard:
            # Any name this process holds or is acquiring stays, whatever its lease.
            mine = {name for name, _ in self._shared.owned.values()}
        ops = []
        for lease_id, keys in alive.items():
            for key in keys:
                for prefix in (self._token_prefix, self._lock_prefix):
                    if key.startswith(prefix):
                        name = key[len(prefix) :].decode()
                        if name not in mine:
                            ops.append((key, lease_id))
        for key, lease_id in ops:  # rare: one guarded delete each
            await self._call(
                "Txn",
                "kv",
                rpc.TxnRequest(
                    compare=[_is(key, "LEASE", lease=lease_id)],
                    success=[_delete(key)],
                ),
            )

    async def release(self, name: str, token: str) -> bool:
        return (await self.release_many([ReleaseItem(name, token)]))[0]

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        ops = []
        for name, token in items:
            token_key = self._token_prefix + name.encode()
            ops.append(
                rpc.RequestOp(
                    request_txn=rpc.TxnRequest(
                        compare=[_is(token_key, "VALUE", value=_digest(token))],
                        success=[_delete(self._lock_prefix + name.encode()), _delete(token_key)],
                    )
                )
            )
        try:
            answer = await self._call("Txn", "kv", rpc.TxnRequest(success=ops))
        finally:
            # Only now: a renewal in flight must not take the keys for an
            # orphan's (and delete them) before this compare-and-delete runs.
            for item in items:
                self._disown(item.token)
        return [bool(response.response_txn.succeeded) for response in answer.responses]

    async def force_release(self, name: str) -> LeaseInfo | None:
        # The token is only a digest here, so the compare is on the grant's
        # create revision (its fencing token) instead; the deletion's own
        # revision is larger than every earlier fencing token.
        found = await self.holder_of(name)
        if found is None:
            return None
        lock_key = self._lock_prefix + name.encode()
        answer = await self._call(
            "Txn",
            "kv",
            rpc.TxnRequest(
                compare=[_is(lock_key, "CREATE", create_revision=found.fencing_token)],
                success=[
                    _delete(lock_key),
                    _delete(self._token_prefix + name.encode()),
                ],
            ),
        )
        return found if answer.succeeded else None

    async def wait_released(self, name: str, timeout: float) -> None:
        seen = self._seen.pop(name, None)
        conn = await self._conn()
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
                answer = await self._call(
                    "Range", "kv", rpc.RangeRequest(key=self._lock_prefix + name.encode())
                )
                if not answer.kvs:
                    return
                seen = int(answer.header.revision)
            if releases.missed(name, seen):
                return
            await woken_within(woken, timeout)
        finally:
            releases.wakeups.remove(name, woken)

    async def _watch_releases(self, conn: _Conn, seen: int | None) -> None:
        """Start this connection's one watch on every lock key's deletion, from
        just after ``seen`` (the revision at which the first waiter saw its lock
        held), or from now."""
        releases = conn.releases
        start = self._lock_prefix

        async def on_event(event: Any) -> None:  # a deletion, or the stream's error
            releases.on_event(len(start), event)

        if seen is None:
            answer = await self._call("Range", "kv", rpc.RangeRequest(key=start, limit=1))
            seen = int(answer.header.revision)
        try:
            await asyncio.wait_for(
                conn.watcher.add_callback(
                    start,
                    on_event,
                    range_end=_prefix_end(start),
                    start_revision=seen + 1,
                    kind=EventKind.DELETE,
                ),
                self.timeout,
            )
        except RevisionCompactedError:  # that revision is gone: from now, and look again
            await self._watch_releases(conn, None)
            return
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            raise self._failed(conn, exc) from exc
        releases.since = seen + 1
        releases.watching = True

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        start = self._lock_prefix + prefix.encode()
        answer = await self._call(
            "Range", "kv", rpc.RangeRequest(key=start, range_end=_prefix_end(start))
        )
        lease_ids = sorted({int(kv.lease) for kv in answer.kvs if kv.lease})
        ttls = await asyncio.gather(
            *(
                self._call("LeaseTimeToLive", "lease", rpc.LeaseTimeToLiveRequest(ID=lease_id))
                for lease_id in lease_ids
            )
        )
        remaining = {
            lease_id: int(info.TTL) for lease_id, info in zip(lease_ids, ttls, strict=True)
        }
        infos = []
        for kv in answer.kvs:
            left = remaining.get(int(kv.lease), -1)
            if left < 0:  # expired (whole seconds left, so 0 is still alive)
                continue
            value = json.loads(kv.value)
            name = kv.key[len(self._lock_prefix) :].decode()
            infos.append(
                LeaseInfo(
                    name,
                    value.get("holder", ""),
                    int(kv.create_revision),
                    float(left),
                    value.get("at"),
                )
            )
        return sorted(infos, key=lambda info: info.name)

    # -- the scheduler's records -------------------------------------------------

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return (await self.claim_occurrences([Claim(task, fire_time, claimant)]))[0]

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        ops = [_read(self._claim_prefix + task.encode()) for task, _ in occurrences]
        answer = await self._call("Txn", "kv", rpc.TxnRequest(success=ops))
        # Claimed when the stored "T/claimant" is not less than "T/" (see claim_occurrences).
        return [
            bool(kvs) and kvs[0].value >= _micros(fire) + b"/"
            for kvs, (_, fire) in zip(
                (response.response_range.kvs for response in answer.responses),
                occurrences,
                strict=True,
            )
        ]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        values = []
        ops = []
        for task, fire_time, claimant in claims:
            key = self._claim_prefix + task.encode()
            occurrence = _micros(fire_time) + b"/"
            # The claimant tells this claim from an equal one of another
            # instance when it is resent after a lost answer.
            value = occurrence + claimant.encode()
            put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))
            values.append(value)
            # Create it if absent, else advance it only forward (fixed-width
            # digits compare as bytes in time order; "T/nonce" is not less
            # than "T/", so an equal occurrence is never claimed twice).
            ops.append(
                rpc.RequestOp(
                    request_txn=rpc.TxnRequest(
                        compare=[_is(key, "CREATE", create_revision=0)],
                        success=[put],
                        failure=[
                            rpc.RequestOp(
                                request_txn=rpc.TxnRequest(
                                    compare=[
                                        rpc.Compare(
                                            key=key,
                                            target=rpc.Compare.VALUE,
                                            result=rpc.Compare.LESS,
                                            value=occurrence,
                                        )
                                    ],
                                    success=[put],
                                    failure=[_read(key)],
                                )
                            )
                        ],
                    )
                )
            )
        answer = await self._call("Txn", "kv", rpc.TxnRequest(success=ops))
        claimed = []
        for response, value in zip(answer.responses, values, strict=True):
            outer = response.response_txn
            inner = outer.responses[0].response_txn
            if outer.succeeded or inner.succeeded:
                claimed.append(True)
            else:
                current = inner.responses[0].response_range.kvs
                claimed.append(bool(current) and current[0].value == value)
        return claimed

    def _run_task_prefix(self, task: str) -> bytes:
        return self._run_prefix + task.encode() + b"\0"

    def _run_key(self, record: RunRecord) -> bytes:
        return (
            self._run_task_prefix(record.task)
            + _micros(record.started)
            + b"/"
            + record.run_id.encode()
        )

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        # RunRecord's fields in order; runs() rebuilds it with RunRecord.from_row(fields).
        puts = [
            rpc.RequestOp(
                request_put=rpc.PutRequest(key=self._run_key(r), value=json.dumps(r.row()).encode())
            )
            for r in records
        ]
        await self._call("Txn", "kv", rpc.TxnRequest(success=puts))
        ended = sorted({r.task for r in records if r.ended is not None})
        if not ended:
            return
        # Each ended run adds at most one record to its task, trimmed here
        # every time: the few oldest keys and the count of each task, in one
        # transaction, say what to delete.
        ranges = []
        for task in ended:
            start = self._run_task_prefix(task)
            ranges.append(
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(
                        key=start, range_end=_prefix_end(start), keys_only=True, limit=_TRIM_SEEN
                    )
                )
            )
        answer = await self._call("Txn", "kv", rpc.TxnRequest(success=ranges))
        extra: list[bytes] = []
        for task, response in zip(ended, answer.responses, strict=True):
            found = response.response_range
            over = int(found.count) - keep
            if over > len(found.kvs):  # more than a batch adds (keep was lowered)
                await self._trim(task, keep)
            elif over > 0:
                extra += sorted(kv.key for kv in found.kvs)[:over]
        await self._delete_keys(extra)

    async def _delete_keys(self, keys: Sequence[bytes]) -> None:
        for begin in range(0, len(keys), _MAX_TXN_OPS):
            await self._call(
                "Txn",
                "kv",
                rpc.TxnRequest(
                    success=[_delete(key) for key in keys[begin : begin + _MAX_TXN_OPS]]
                ),
            )

    async def _trim(self, task: str, keep: int) -> int:
        start = self._run_task_prefix(task)
        answer = await self._call(
            "Range",
            "kv",
            rpc.RangeRequest(key=start, range_end=_prefix_end(start), keys_only=True),
        )
        keys = sorted(kv.key for kv in answer.kvs)
        extra = keys[: max(0, len(keys) - keep)]
        await self._delete_keys(extra)
        return len(extra)

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        # Rare (the prune task, for dead instances' runs): a read, then a put
        # on the condition that the key did not change since.
        written = 0
        for record in records:
            key = self._run_key(record)
            found = await self._call("Range", "kv", rpc.RangeRequest(key=key))
            if not found.kvs or json.loads(found.kvs[0].value)[6] != RunOutcome.RUNNING:
                continue
            answer = await self._call(
                "Txn",
                "kv",
                rpc.TxnRequest(
                    compare=[_is(key, "MOD", mod_revision=found.kvs[0].mod_revision)],
                    success=[
                        rpc.RequestOp(
                            request_put=rpc.PutRequest(
                                key=key, value=json.dumps(record.row()).encode()
                            )
                        )
                    ],
                ),
            )
            written += bool(answer.succeeded)
        return written

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        start = self._run_prefix if task is None else self._run_task_prefix(task)
        request = rpc.RangeRequest(key=start, range_end=_prefix_end(start))
        if task is not None:  # keys sort by start time within one task
            request.sort_order = rpc.RangeRequest.DESCEND
            request.sort_target = rpc.RangeRequest.KEY
            request.limit = limit
        answer = await self._call("Range", "kv", request)
        found = [RunRecord.from_row(json.loads(kv.value)) for kv in answer.kvs]
        found.sort(key=lambda r: r.started, reverse=True)
        return found[:limit]

    async def prune(self, *, keep_runs: int) -> int:
        # Leases and their keys expire by themselves in etcd, and fencing tokens
        # are revisions, which never go back: only run records need trimming.
        answer = await self._call(
            "Range",
            "kv",
            rpc.RangeRequest(
                key=self._run_prefix, range_end=_prefix_end(self._run_prefix), keys_only=True
            ),
        )
        tasks = {kv.key[len(self._run_prefix) :].split(b"\0", 1)[0].decode() for kv in answer.kvs}
        return sum([await self._trim(task, keep_runs) for task in sorted(tasks)])
