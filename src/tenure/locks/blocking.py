"""Semaphores and leader election for blocking code (``tenure.sync``).

Each call runs the asyncio core's (``Semaphore``, ``Election``) on the
service's loop thread: one source of truth. A permit and a term are
``tenure.sync.Lock`` objects; ``Election.serve`` runs on the calling thread
and calls the callbacks there, until ``stop()``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _validate
from .._aio import is_async
from ..errors import InvalidArgument
from ..stores.semaphores import SemaphoreState
from . import election as _election
from . import semaphore as _semaphore
from .running import Outcome

if TYPE_CHECKING:
    from ..sync import Lock, LockService

__all__ = ("Election", "Semaphore", "Term")

_POLL = 0.2
"""Seconds ``serve`` waits at a time before it looks whether ``stop()`` was called."""


class Semaphore:
    """A cluster-wide limit of ``limit`` holders, for blocking code: the
    asyncio ``tenure.Semaphore``'s rules; permits are ``tenure.sync.Lock``."""

    def __init__(self, service: LockService, core: _semaphore.Semaphore) -> None:
        self.service = service
        self.core = core

    @property
    def name(self) -> str:
        return self.core.name

    @property
    def limit(self) -> int:
        return self.core.limit

    def acquire(self, *, ttl: float = _validate.DEFAULT_TTL, wait: float = 0.0) -> Lock | None:
        """A permit, or None when all are held (after ``wait`` seconds, if given)."""
        permit = self.service._portal.call(self.core.acquire(ttl=ttl, wait=wait))
        return None if permit is None else _permit_class()(self.service, permit)

    def run_exclusively(
        self, fn: Callable[..., Any], *args: Any, ttl: float = _validate.DEFAULT_TTL, **kwargs: Any
    ) -> Outcome:
        """Run ``fn`` on this thread under a permit if one is free, else skip
        (``LockService.run_exclusively``'s rules)."""
        if not callable(fn) or is_async(fn):
            raise InvalidArgument(f"fn must be a plain callable, got {fn!r}")
        permit = self.acquire(ttl=ttl)
        if permit is None:
            return Outcome.SKIPPED
        return self.service.run_holding(permit, fn, args, kwargs)

    def state(self) -> SemaphoreState:
        """The store's view: the live limit, the permits, how many wait."""
        return self.service._portal.call(self.core.state())

    def __repr__(self) -> str:
        return repr(self.core)


class Term:
    """One term of leadership, for blocking code: ``lock`` (a
    ``tenure.sync.Lock``), its number as ``fencing_token``, and ``resign()``."""

    __slots__ = ("lock", "name")

    def __init__(self, name: str, lock: Lock) -> None:
        self.name = name
        self.lock = lock

    def __getattr__(self, attribute: str) -> Any:  # fencing_token, held, lost, lost_reason ...
        return getattr(self.lock, attribute)

    def resign(self) -> bool:
        """Step down; False when the term was no longer held."""
        return self.lock.release()

    def __enter__(self) -> Term:
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.__exit__(None, None, None)

    def __repr__(self) -> str:
        return f"<Term of {self.name!r} number={self.lock.fencing_token}>"


class Election:
    """Leader election for blocking code (see ``tenure.Election``)."""

    def __init__(
        self,
        service: LockService,
        name: str,
        *,
        on_elected: Callable[[Term], Any] | None = None,
        on_revoked: Callable[[str], Any] | None = None,
    ) -> None:
        self.service = service
        self.core = service.core.election(name)
        self.on_elected = _election.check_callback(on_elected, "on_elected")
        self.on_revoked = _election.check_callback(on_revoked, "on_revoked")
        for fn in (on_elected, on_revoked):
            if fn is not None and is_async(fn):
                raise InvalidArgument(f"{fn!r} is an async function; use tenure.LockService")
        self._stop = threading.Event()

    @property
    def name(self) -> str:
        return self.core.name

    def campaign(
        self, *, ttl: float = _validate.DEFAULT_TTL, wait: float = math.inf
    ) -> Term | None:
        """Block until elected (or ``wait`` seconds passed: None)."""
        term = self.service._portal.call(self.core.campaign(ttl=ttl, wait=wait))
        return None if term is None else Term(self.name, _lock(self.service, term.lock))

    def leader(self) -> str | None:
        """The current leader's holder id, or None."""
        return self.service._portal.call(self.core.leader())

    def serve(self, *, ttl: float = _validate.DEFAULT_TTL) -> None:
        """Campaign, call ``on_elected(term)``, wait for the term's end, call
        ``on_revoked(reason)``, and again, on this thread, until :meth:`stop`."""
        ttl = _validate.check_ttl(ttl)
        self._stop.clear()
        while not self._stop.is_set():
            term = self._campaign_until_stopped(ttl)
            if term is None:
                return
            try:
                if self.on_elected is not None:
                    self.on_elected(term)
                while not self._stop.is_set() and not term.lock.wait_lost(_POLL):
                    pass
            finally:
                resigned = term.lock.lost_reason is None
                term.lock.__exit__(None, None, None)
                if self.on_revoked is not None:
                    self.on_revoked(term.lock.lost_reason or _election.RESIGNED)
            if resigned:
                self._stop.wait(_election.RESIGN_GRACE)

    def _campaign_until_stopped(self, ttl: float) -> Term | None:
        pending = self.service.submit(self.core.campaign(ttl=ttl))
        while True:
            try:
                core_term = pending.result(timeout=_POLL)
            except concurrent.futures.TimeoutError:
                if self._stop.is_set():
                    pending.cancel()
                    return None
                continue
            assert core_term is not None  # wait=inf
            term = Term(self.name, _lock(self.service, core_term.lock))
            if self._stop.is_set():
                term.resign()
                return None
            return term

    def stop(self) -> None:
        """Make :meth:`serve` return (resigning a term it holds); any thread may call."""
        self._stop.set()

    def __repr__(self) -> str:
        return repr(self.core)


def _lock(service: LockService, core: Any) -> Lock:
    from ..sync import Lock  # tenure.sync imports this module last: no cycle at import

    return Lock(service, core)


@functools.cache
def _permit_class() -> type[Lock]:
    """``tenure.sync.Lock`` for a permit: released on the loop thread, since the
    store's plain calls (the lock's fast path) know nothing of semaphores."""
    from ..sync import Lock

    class Permit(Lock):
        __slots__ = ()

        def release(self) -> bool:
            released: bool = self._service._portal.call(self._lock.release())
            return released

        def __exit__(self, *exc: object) -> None:
            self._service._portal.call(self._lock.__aexit__(None, None, None))

    return Permit
