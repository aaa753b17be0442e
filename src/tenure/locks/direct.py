"""Direct: acquire and release on the calling thread, the blocking API's one seam."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .. import _validate
from .._tokens import new_token
from ..errors import InvalidArgument, StoreUnavailable, TenureError
from ..events import Event, EventKind
from ..stores.base import BlockingLeases, Store
from .lock import Lock, release_failed

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("Direct",)


class Direct:
    """The one seam for callers without an event loop (``tenure.sync``):
    acquire and release made on the calling thread, through the store's plain
    calls (``Store.blocking``).

    Only the store call differs from :meth:`LockService.acquire` and
    :meth:`Lock.release`: the checks, the local deadline, the renewer, the
    events and the errors are theirs (the same private halves). Waiting is
    not here: a store's waiters live on an event loop. Any thread may call.
    """

    __slots__ = ("_plain", "_store", "service")

    def __init__(self, service: LockService) -> None:
        self.service = service
        self._store: Store | None = None
        self._plain: BlockingLeases | None = None

    def _calls(self) -> BlockingLeases:
        # The service's store is read each time (a forked child's service has
        # a store of its own); its plain calls only when it is another store.
        store = self.service.store
        if store is self._store and self._plain is not None:
            return self._plain
        calls = store.blocking()
        if calls is None:
            raise TenureError(f"{store.describe()} has no blocking calls")
        self._store, self._plain = store, calls
        return calls

    def acquire(
        self, name: str, *, ttl: float = _validate.DEFAULT_TTL, wait: float = 0.0
    ) -> Lock | None:
        """:meth:`LockService.acquire`, on this thread. ``wait`` is checked as
        acquire checks it, and must be 0."""
        service = self.service
        ttl, wait = service._admit(name, ttl, wait)
        if wait:
            raise InvalidArgument(f"a direct acquire cannot wait (wait={wait!r}); use acquire")
        token = new_token()
        sent = time.monotonic()
        try:
            grant = self._calls().acquire(name, token, ttl, service.holder)
        except StoreUnavailable as exc:
            if service._hooks.hooks:
                service._hooks.emit(
                    Event(EventKind.UNAVAILABLE, name, service.holder, detail=str(exc))
                )
            raise
        lock = service._granted(name, token, ttl, sent, grant)
        if service._hooks.hooks:
            service._observed(name, lock, time.monotonic() - sent)
        return lock

    def release(self, lock: Lock, *, quietly: bool = False) -> bool:
        """:meth:`Lock.release`, on this thread; ``quietly``: a store failure is
        logged, not raised (as leaving ``async with lock`` does)."""
        lease = lock._lease
        if lease.released:
            return False
        was_held = lock._leave()
        try:
            in_store = self._calls().release(lease.name, lease.token)
        except TenureError as exc:
            if not quietly:
                raise
            release_failed(lock, exc)
            in_store = False
        if self.service._hooks.hooks:
            return lock._left(was_held, in_store)
        return was_held and in_store
