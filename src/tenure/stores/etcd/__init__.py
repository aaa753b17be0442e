"""etcd: leases in a consensus store, the one store whose grants survive the loss of a server.

URL: ``etcd://[user:password@]host:port[,host:port...][?options]``. Options:
``prefix`` (key prefix, default ``tenure``), ``timeout`` (seconds per call,
default 2, and seconds a call may queue for its turn), ``in_flight_max``
(calls sent at once on the store's one channel, default 64: further callers
queue for a turn, first come, first served), ``tls`` (true/false), ``ca``,
``cert``, ``key`` (PEM files; ``ca`` alone verifies the server, ``cert`` +
``key`` add a client certificate).

* **Release** is a transaction comparing ``P/token/N`` with the token's digest.
* A forced release compares the grant's create revision (its fencing token)
  instead; the deletion's own revision is larger than every earlier fencing
  token.

Where the rest lives: ``keys`` (the key layout), ``transport`` (the gRPC
channel, failover, retry), ``grants`` (shared etcd leases, acquire, renewal),
``waiting`` (the release watch), ``runlog`` (claims and run records),
``semaphores`` (permits and their queue).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

from aetcd import rpc

from ...errors import ConfigurationError
from .._gate import Gate
from .._options import check_pool_max, mask, options
from ..base import AcquireItem, Grant, LeaseInfo, ReleaseItem, RenewItem, Store
from .grants import Grants, Shared
from .keys import MAX_TXN_OPS, Keys, delete, digest, is_, prefix_end
from .runlog import EtcdRunLog
from .semaphores import EtcdPermits
from .transport import Transport
from .waiting import Waiting

__all__ = ("IN_FLIGHT_MAX", "EtcdStore")

IN_FLIGHT_MAX = 64
"""Calls a store sends at once on its channel by default (``in_flight_max``)."""

_OPTIONS = {
    "prefix": str,
    "timeout": float,
    "in_flight_max": int,
    "tls": bool,
    "ca": str,
    "cert": str,
    "key": str,
}


class EtcdStore(Store):
    """Leases in an etcd cluster. See the module docstring."""

    scheme: ClassVar[str] = "etcd"
    gate: Gate

    # A nested transaction's operations count against what its parent leaves
    # of --max-txn-ops (128 by default): 126 items, each a transaction of at
    # most two operations a level, fill one.
    batch_max: ClassVar[int] = MAX_TXN_OPS - 2

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
        _shared: Shared | None = None,
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
        self.tls = tls or ca is not None or cert is not None
        self._shared = Shared() if _shared is None else _shared
        """What this store and its siblings share: the etcd leases, the tokens held."""
        self.keys = Keys(prefix)
        self.transport = Transport(
            endpoints,
            where=f"etcd at {self.describe()}",
            timeout=timeout,
            in_flight_max=in_flight_max,
            username=username,
            password=password,
            tls=self.tls,
            ca=ca,
            cert=cert,
            key=key,
            pid=self._shared.pid,
        )
        self.gate = self.transport.gate
        self.waiting = Waiting(self.transport, self.keys)
        self.grants = Grants(
            self.transport, self.keys, self._shared, self.waiting, self.release_many
        )
        self._semaphores = EtcdPermits(self.transport, self.keys, self.grants)
        self._runlog = EtcdRunLog(self, self.transport, self.keys)

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
        ours, _ = options("etcd", query, _OPTIONS, others=False)
        files: dict[str, bytes] = {}
        for name in ("ca", "cert", "key"):
            path = ours.pop(name, None)
            if path is not None:
                try:
                    files[name] = Path(path).read_bytes()
                except OSError as exc:
                    raise ConfigurationError(
                        f"cannot read the etcd {name} file {path!r}: {exc.strerror}"
                    ) from None
        return cls(
            endpoints,
            username=username,
            password=password,
            ca=files.get("ca"),
            cert=files.get("cert"),
            key=files.get("key"),
            **ours,
        )

    def describe(self) -> str:
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.endpoints)
        user = f"{self.username}:***@" if self.username is not None else ""
        return f"etcd://{user}{hosts}"

    @property
    def runlog(self) -> EtcdRunLog:
        return self._runlog

    @property
    def semaphores(self) -> EtcdPermits:
        return self._semaphores

    def sibling(self) -> EtcdStore:
        # gRPC's asyncio channels belong to one loop; the leases and the
        # registry of owned tokens are shared.
        return self.remade(_shared=self._shared)

    async def warm_up(self) -> None:
        await self.transport.warm_up()

    async def aclose(self) -> None:
        await self.transport.aclose()

    # -- leases ------------------------------------------------------------------

    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        return (await self.grants.acquire_many([AcquireItem(name, token, ttl, holder)]))[0]

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        return await self.grants.acquire_many(items)

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        return await self.grants.renew(batch)

    async def release(self, name: str, token: str) -> bool:
        return (await self.release_many([ReleaseItem(name, token)]))[0]

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        ops = []
        for name, token in items:
            token_key = self.keys.token(name)
            ops.append(
                rpc.RequestOp(
                    request_txn=rpc.TxnRequest(
                        compare=[is_(token_key, "VALUE", value=digest(token))],
                        success=[delete(self.keys.lock(name)), delete(token_key)],
                    )
                )
            )
        try:
            answer = await self.transport.call("Txn", "kv", rpc.TxnRequest(success=ops))
        finally:
            # Only now: a renewal in flight must not take the keys for an
            # orphan's (and delete them) before this compare-and-delete runs.
            for item in items:
                self.grants.disown(item.token)
        return [bool(response.response_txn.succeeded) for response in answer.responses]

    async def force_release(self, name: str) -> LeaseInfo | None:
        # The token is only a digest here, so the compare is on the grant's
        # create revision (its fencing token) instead; the deletion's own
        # revision is larger than every earlier fencing token.
        found = await self.holder_of(name)
        if found is None:
            return None
        lock_key = self.keys.lock(name)
        answer = await self.transport.call(
            "Txn",
            "kv",
            rpc.TxnRequest(
                compare=[is_(lock_key, "CREATE", create_revision=found.fencing_token)],
                success=[
                    delete(lock_key),
                    delete(self.keys.token(name)),
                ],
            ),
        )
        return found if answer.succeeded else None

    async def wait_released(self, name: str, timeout: float) -> None:
        await self.waiting.wait_released(name, timeout)

    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        start = self.keys.locks + prefix.encode()
        answer = await self.transport.call(
            "Range", "kv", rpc.RangeRequest(key=start, range_end=prefix_end(start))
        )
        lease_ids = sorted({int(kv.lease) for kv in answer.kvs if kv.lease})
        ttls = await asyncio.gather(
            *(
                self.transport.call(
                    "LeaseTimeToLive", "lease", rpc.LeaseTimeToLiveRequest(ID=lease_id)
                )
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
            name = kv.key[len(self.keys.locks) :].decode()
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

    async def prune(self, *, keep_runs: int) -> int:
        # Leases and their keys expire by themselves in etcd, and fencing tokens
        # are revisions, which never go back: only run records need trimming.
        return await self._runlog.trim_all(keep_runs)
