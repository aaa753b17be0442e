"""The store contract: the one place that says what every store must do.

A store keeps leases (this module) and, beside them, the scheduler's run log
(``stores.runlog``, offered as ``store.runlog``) and semaphores
(``stores.semaphores``, offered as ``store.semaphores``). A lease is a name held
under a secret token until an expiry that the *store's* clock decides (Redis
``PX``, SQL server time, the host's monotonic clock for SQLite); a client
never compares timestamps that other hosts wrote. Everything above this
module (``LockService``, the renewer, the scheduler) is written against this
contract only.

Rules every implementation follows:

* Each operation is one atomic step in the store: one script, one statement,
  one transaction. Acquire, release and a whole renewal batch are each a single
  round trip on a networked store.
* Renewal and release are compare-and-set on ``(name, token)``. A token that is
  no longer the current one changes nothing.
* Fencing tokens strictly increase per name across releases, expiries, pruning
  and, where the store is durable, restarts.
* Driver and I/O errors surface as :class:`~tenure.errors.StoreUnavailable`
  with the driver's exception as ``__cause__``; contention is never an error.
* Methods are coroutines. A store may be used from more than one thread, each
  with its own event loop (the renewer runs on a thread of its own): it keeps
  a connection per thread or per loop, or returns an independent copy of itself
  from :meth:`Store.sibling`.
* Tokens are secrets: a store never logs them and never returns them from
  :meth:`Store.holders`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Self

from ._gate import Gate

if TYPE_CHECKING:
    from .runlog import RunLog
    from .semaphores import Permits

__all__ = (
    "AcquireItem",
    "BlockingLeases",
    "Finding",
    "Grant",
    "HandedOver",
    "HandsOver",
    "LeaseInfo",
    "ReleaseItem",
    "RenewItem",
    "Store",
    "evict",
)


@dataclass(slots=True)  # not frozen: made on every acquire, and frozen costs twice as much
class Grant:
    """A successful acquisition."""

    fencing_token: int


class HandedOver(NamedTuple):
    """A grant that :meth:`Store.acquire_waiting` obtained, and what its holder may assume."""

    grant: Grant
    sent: float
    """A ``time.monotonic()`` no later than the grant (the local clock's view)."""
    lease: float
    """Seconds from ``sent`` during which the store keeps the lease for sure:
    the TTL when the waiter's own call granted it, the hand-over lease when a
    release did."""


class RenewItem(NamedTuple):
    """One lease of a renewal batch (a tuple: thousands are made per batch)."""

    name: str
    token: str
    ttl: float


class AcquireItem(NamedTuple):
    """One acquire of a batch (:meth:`Store.acquire_many`)."""

    name: str
    token: str
    ttl: float
    holder: str


class ReleaseItem(NamedTuple):
    """One release of a batch (:meth:`Store.release_many`)."""

    name: str
    token: str


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """What an operator may see of a held lease: never its token."""

    name: str
    holder: str
    fencing_token: int
    expires_in: float
    """Seconds until the lease expires unless renewed, by the store's clock."""
    acquired_at: float | None = None
    """When it was granted, POSIX seconds (the store's clock where it has one:
    Redis and PostgreSQL; else the acquiring host's), None if unknown."""


class HandsOver(ABC):
    """A store whose release hands the lease to a queued waiter in the same
    atomic step (Redis, PostgreSQL): the waiter holds the lock as soon as it
    hears of it, without another round trip. ``LockService`` waits through
    :meth:`acquire_waiting` on such a store, and through
    :meth:`Store.wait_released` on the others."""

    @abstractmethod
    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        """Acquire ``name`` for ``token``, waiting up to ``timeout`` seconds (may be inf).

        The waiter queues itself
        in the store; a release hands the lease straight to the waiter queued
        next, for ``handover`` seconds (at most ``ttl``), which the new holder's
        renewer then extends to ``ttl``: a waiter that died while queued keeps
        the name from others for about ``handover``, not a whole TTL. Waiters
        still wake on every release and on the expiry of the current lease, as
        :meth:`wait_released` does, and try again. Returns None when
        ``timeout`` passed without a grant; then nothing of this waiter stays
        queued, and a lease handed over just before is returned, not dropped.
        Cancelled, or failing with StoreUnavailable, it withdraws and releases
        ``token`` in the background (a queue entry lapses by itself within a
        second or so when the store cannot be reached).
        """


class BlockingLeases(ABC):
    """A store's acquire and release as plain calls (:meth:`Store.blocking`).

    The same atomic steps, answers and errors as :meth:`Store.acquire` and
    :meth:`Store.release`, made on the calling thread; any thread may call.
    Everything else (waiting, renewal, listings) stays on the store's
    coroutines.
    """

    @abstractmethod
    def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        """:meth:`Store.acquire`, on the calling thread."""

    @abstractmethod
    def release(self, name: str, token: str) -> bool:
        """:meth:`Store.release`, on the calling thread."""


class PrintsSchema(ABC):
    """A store whose tables an operator may create ahead of time, from SQL it
    prints (``tenure schema``), instead of letting the store create them."""

    @abstractmethod
    def schema_sql(self) -> str:
        """The SQL that creates this store's tables, for its URL's options."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``tenure doctor`` found about a store's configuration."""

    level: str
    """``ok``, ``warn`` (a guarantee is weaker than it could be) or ``unsafe``
    (locks can be lost or granted twice: ``tenure doctor`` exits non-zero)."""
    what: str
    fix: str = ""
    """What to change, for ``warn`` and ``unsafe``."""


class Store(ABC):
    """A place where leases live. See the module docstring for the rules."""

    scheme: ClassVar[str]
    """The URL scheme this store is registered under."""

    gate: Gate | None = None
    """The bound on this store's calls in flight, where it has one (the
    networked stores): callers past it queue for a turn, in order, for up to
    the store's timeout. Its counters show how much queued. None for stores
    whose calls complete without waiting on a network (memory, SQLite)."""

    batch_max: ClassVar[int] = 500
    """The most items one call of a batch method takes (:meth:`acquire_many`,
    :meth:`release_many`, and the run log's): callers split longer batches.
    etcd's is its transaction limit (128)."""

    @classmethod
    @abstractmethod
    def from_url(cls, url: str) -> Store:
        """The store a URL of this scheme names; ConfigurationError when it is bad.

        Checks what it can without waiting on the network (the URL's form, its
        options, a local file), so that misconfiguration fails at start-up.
        """

    @classmethod
    def for_reading(cls, url: str) -> str:
        """``url``, changed so that opening it creates no storage that is not
        there yet: what read-only tools (``tenure locks``, ``tasks``, ``doctor``,
        ``web``) open, so that a mistyped location fails instead of reading as
        empty. The default returns ``url``: a server's store is there when the
        server is (SQLite overrides it: a missing file is an error)."""
        return url

    @property
    @abstractmethod
    def runlog(self) -> RunLog:
        """The scheduler's claims and run records, kept in this store beside
        its leases (``stores.runlog``)."""

    @property
    @abstractmethod
    def semaphores(self) -> Permits:
        """The semaphores kept in this store, in a namespace of their own
        (``stores.semaphores``)."""

    @abstractmethod
    async def acquire(self, name: str, token: str, ttl: float, holder: str) -> Grant | None:
        """Grant ``name`` to ``token`` for ``ttl`` seconds if it is free or expired.

        Atomic: either the lease is created (or an expired one taken over) with a
        fencing token greater than every earlier grant of ``name``, and a Grant is
        returned, or nothing changes and None is returned because a live lease
        exists. ``holder`` is a display id for operators (``host:pid:id``).
        """

    @abstractmethod
    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        """Extend every lease of ``batch`` whose token is still current and unexpired.

        The whole batch is one round trip. Each lease's new expiry is its own
        ``ttl`` from the store's now. Returns one bool per item, in order: True
        when extended, False when the token is gone or the lease had expired (a
        lapsed lease is never revived). Raises StoreUnavailable when the store
        cannot be reached; then nothing is known about any item.
        """

    @abstractmethod
    async def release(self, name: str, token: str) -> bool:
        """Delete the lease of ``name`` if ``token`` is still its token; wake waiters.

        Compare-and-set: a token that is not the current one changes nothing
        and returns False. A lease that is still ``token``'s but already
        expired is removed too, and False is returned: the grant was no longer
        valid. True only when a live lease held by ``token`` was released.
        A store that :class:`HandsOver` then grants the lease to the waiter
        queued next, if one is, in the same atomic step.
        """

    @abstractmethod
    async def wait_released(self, name: str, timeout: float) -> None:
        """Return when ``name`` may have become free, or after ``timeout`` seconds.

        Woken by a release (a notification, not a poll) and by the expiry of
        the current lease. May return early or spuriously: the caller retries
        acquire and calls again. ``timeout`` is finite and positive.
        """

    @abstractmethod
    async def holders(self, prefix: str = "") -> list[LeaseInfo]:
        """The live leases whose names start with ``prefix``, sorted by name."""

    # -- batches: what many concurrent callers ask for, in as few round trips
    # as the store allows (the scheduler's tick). Each item is one atomic step
    # on its own, exactly as the single call; the batch is not all-or-nothing.
    # At most ``batch_max`` items per call. StoreUnavailable means nothing is
    # known about any item: some may have been applied. The defaults make one
    # call per item (the memory store needs no more).

    async def acquire_many(self, items: Sequence[AcquireItem]) -> list[Grant | None]:
        """:meth:`acquire` for each item (distinct names); one answer each, in order."""
        return [await self.acquire(*item) for item in items]

    async def release_many(self, items: Sequence[ReleaseItem]) -> list[bool]:
        """:meth:`release` for each item (distinct names); one answer each, in order."""
        return [await self.release(*item) for item in items]

    @abstractmethod
    async def prune(self, *, keep_runs: int) -> int:
        """Remove what is no longer needed; returns how many entries were removed.

        Released and expired leases (without ever letting a later grant of the
        same name get a smaller fencing token), waiter registrations past their
        time, and run records beyond the ``keep_runs`` newest of each task. One
        atomic step; live leases and occurrence claims are never touched.
        """

    async def holder_of(self, name: str) -> LeaseInfo | None:
        """The live lease of exactly ``name`` (``holders`` matches a prefix), or None."""
        return next((i for i in await self.holders(name) if i.name == name), None)

    @abstractmethod
    async def force_release(self, name: str) -> LeaseInfo | None:
        """Free ``name`` whoever holds it: an operator's action on a stale lock.

        Returns the grant it removed, or None when nothing live was held (or the
        lock changed hands while this ran: look again). Waiters are woken, and
        the name's fencing counter is advanced past the evicted grant, so every
        later grant's token is larger and fenced resources refuse the evicted
        holder's writes once they have seen one. The evicted holder learns of it
        at its next renewal (its lock is then lost). Most stores make it with
        :func:`evict`. Operators call ``LockService.force_release``, which also
        leaves an audit record (``stores.audit``) and an event.
        """

    async def server_time(self) -> float | None:
        """The store's clock now, POSIX seconds; None for a store without a clock
        of its own (SQLite and memory use this host's; etcd has no clock API)."""
        return None

    async def diagnose(self) -> list[Finding]:
        """What this store's configuration means for the guarantees (``tenure doctor``)."""
        return []

    async def warm_up(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Open connections ahead of first use (the renewer calls it as it starts).

        Never raises: a store that cannot be reached now says so at its first
        real call.
        """

    def blocking(self) -> BlockingLeases | None:
        """This store's acquire and release as plain calls on the caller's
        thread, or None when it has none (etcd).

        The blocking API (``tenure.sync``) uses it for its fast path: no event
        loop, no thread hop. Made at the first call and kept: the same object
        every time, closed with the store by :meth:`aclose`.
        """
        return None

    def sibling(self) -> Store:
        """A store for another thread's event loop, sharing this one's data.

        The renewer calls this once and closes what it gets back when that is
        not ``self``. The default returns ``self``, for stores that are safe to
        call from any thread's loop; the others return :meth:`remade`.
        """
        return self

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        store = super().__new__(cls)
        # What remade() makes another of: no store copies its options by hand.
        store._made_with = (args, kwargs)
        return store

    _made_with: tuple[tuple[Any, ...], dict[str, Any]]

    def remade(self, **changes: Any) -> Self:
        """A new store made with this one's constructor arguments (and ``changes``)."""
        args, kwargs = self._made_with
        return type(self)(*args, **{**kwargs, **changes})

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Close connections. The store must not be used afterwards."""

    def describe(self) -> str:
        """The store's URL with any password masked, for messages and logs."""
        return f"{self.scheme}://"


async def evict(
    name: str,
    live_grant: Callable[[str], Awaitable[tuple[str, LeaseInfo] | None]],
    release: Callable[[str, str], Awaitable[bool]],
    bump_fence: Callable[[str], Awaitable[None]] | None = None,
) -> LeaseInfo | None:
    """:meth:`Store.force_release` from a store's own steps: ``live_grant``
    reads the current token and what operators may see (the token never
    leaves the store's code), ``release`` removes exactly that grant (its
    compare-and-set), and ``bump_fence`` advances the name's fencing counter
    (not needed where tokens come from one sequence)."""
    found = await live_grant(name)
    if found is None:
        return None
    token, info = found
    if not await release(name, token):
        return None
    if bump_fence is not None:
        await bump_fence(name)
    return info
