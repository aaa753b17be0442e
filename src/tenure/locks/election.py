"""Leader election: one leader of a name at a time, terms that only go up.

A term is a lock in the elections' own namespace (a lock name no caller can
make: it starts with a control character), so it has every guarantee of a
lock: one holder at a time by the store's clock, renewal by the service's
renewer, loss at the local deadline, and a fencing token (the term's number)
larger than every earlier term's. Campaigners wait in the lock's queue, so a
resignation hands over to the longest-waiting one.

A leader that is paused (a GC pause, SIGSTOP) past its TTL may not hear of its
revocation before another is elected: what makes the stale leader harmless
is its term number, passed to what it writes as a fencing token.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .. import _validate
from .._aio import is_async, shielded
from ..errors import InvalidArgument
from .lock import Lock
from .waiting import acquire_waiting

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("ELECTION_PREFIX", "RESIGNED", "Election", "Term", "check_callback", "shown")

log = logging.getLogger("tenure")

ELECTION_PREFIX = "\x1felection\x1f"
"""What an election's lock name starts with: control characters, which no
lock name may hold, so that an election never meets a lock."""

RESIGNED = "resigned"
"""``on_revoked``'s reason when the leader resigned (or ``serve`` stopped)."""

RESIGN_GRACE = 1.0
"""Seconds ``serve`` waits after its leader resigned before campaigning again:
the next campaigner takes over first."""


def shown(name: str) -> str:
    """A lock name as an operator reads it: an election's term as ``election NAME``
    (its lock name starts with control characters)."""
    if name.startswith(ELECTION_PREFIX):
        return f"election {name[len(ELECTION_PREFIX) :]}"
    return name


def check_callback(fn: object, what: str) -> Callable[..., Any] | None:
    if fn is not None and not callable(fn):
        raise InvalidArgument(f"{what} must be callable or None, got {fn!r}")
    return fn


class Term:
    """One term of leadership: the ``Lock`` surface (``held``, ``lost``,
    ``lost_reason``, ``held_until``, ``wait_lost()``, ``async with``), its
    number as ``fencing_token``, and :meth:`resign`."""

    __slots__ = ("election", "lock")

    def __init__(self, election: Election, lock: Lock) -> None:
        self.election = election
        self.lock = lock

    @property
    def name(self) -> str:
        return self.election.name

    @property
    def fencing_token(self) -> int:
        """The term's number: larger than every earlier term's of this election."""
        return self.lock.fencing_token

    @property
    def ttl(self) -> float:
        return self.lock.ttl

    @property
    def held(self) -> bool:
        return self.lock.held

    @property
    def held_until(self) -> float:
        return self.lock.held_until

    @property
    def lost(self) -> bool:
        return self.lock.lost

    @property
    def lost_reason(self) -> str | None:
        return self.lock.lost_reason

    async def resign(self) -> bool:
        """Step down: the next campaigner is elected at once. False when the
        term was no longer held (as a stale release); nothing changes then."""
        return await self.lock.release()

    release = resign

    async def wait_lost(self) -> None:
        """Return as soon as the term is over: lost, or resigned."""
        await self.lock.wait_lost()

    async def __aenter__(self) -> Term:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.lock.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost else "resigned")
        return f"<Term of {self.name!r} number={self.fencing_token} {state}>"


class Election:
    """Leader election among the services that campaign for ``name``.

    From ``LockService.election(name, on_elected=..., on_revoked=...)``.
    ``on_elected(term)`` and ``on_revoked(reason)`` may be plain or async
    functions; :meth:`serve` calls them.
    """

    __slots__ = ("key", "name", "on_elected", "on_revoked", "service")

    def __init__(
        self,
        service: LockService,
        name: str,
        *,
        on_elected: Callable[[Term], Any] | None = None,
        on_revoked: Callable[[str], Any] | None = None,
    ) -> None:
        self.name = _validate.check_name(name, "election name")
        room = _validate.MAX_NAME_BYTES - len(ELECTION_PREFIX)
        if len(name.encode()) > room:
            raise InvalidArgument(f"election name {name[:40]!r}... is longer than {room} bytes")
        self.on_elected = check_callback(on_elected, "on_elected")
        self.on_revoked = check_callback(on_revoked, "on_revoked")
        self.service = service
        self.key = ELECTION_PREFIX + name

    async def campaign(
        self, *, ttl: float = _validate.DEFAULT_TTL, wait: float = math.inf
    ) -> Term | None:
        """Wait until elected and return the term, or None when ``wait``
        seconds passed first (``wait=0``: only if nobody leads now)."""
        ttl, wait = self.service._admit(self.name, ttl, wait)
        lock = await acquire_waiting(self.service, self.key, ttl, wait)
        return None if lock is None else Term(self, lock)

    async def leader(self) -> str | None:
        """The current leader's holder id (``host:pid:id``), or None."""
        info = await self.service.store.holder_of(self.key)
        return None if info is None else info.holder

    async def serve(self, *, ttl: float = _validate.DEFAULT_TTL) -> None:
        """Campaign, call ``on_elected(term)``, wait until the term is lost or
        resigned, call ``on_revoked(reason)``, and again, until cancelled.
        Cancelled while leading, it resigns and calls ``on_revoked("resigned")``
        before the cancellation goes on."""
        ttl = _validate.check_ttl(ttl)
        while True:
            term = await self.campaign(ttl=ttl)
            assert term is not None  # wait=inf
            try:
                await _call(self.on_elected, term)
                await term.wait_lost()
            finally:
                if term.held:
                    await shielded(self.service._release_quietly(term.lock))
                await shielded(_call(self.on_revoked, term.lost_reason or RESIGNED))
            if term.lost_reason is None:
                await asyncio.sleep(RESIGN_GRACE)

    def __repr__(self) -> str:
        return f"<Election {self.name!r}>"


def _call(fn: Callable[..., Any] | None, arg: Any) -> Awaitable[None]:
    async def call() -> None:
        if fn is None:
            return
        if is_async(fn):
            await fn(arg)
        else:
            fn(arg)

    return call()
