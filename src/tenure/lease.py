"""One grant's local state, shared by its Lock and the renewer: the local
deadline, the loss and its reason, the release, and who waits for the loss.

A lease's deadline is the monotonic time at which the acquire or renewal that
last succeeded was *sent*, plus its TTL, minus a safety margin
(:func:`safety_margin`). The store set the lease's expiry no earlier than that
send, so while the local deadline has not passed the store still has the
lease, whatever became of the network since.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from ._aio import settle

__all__ = (
    "LOST_BY_DEADLINE",
    "LOST_BY_FORK",
    "LOST_BY_STORE",
    "LeaseState",
    "handover_lease",
    "renew_interval",
    "safety_margin",
)

log = logging.getLogger("tenure.renewer")

LOST_BY_DEADLINE = "no renewal was confirmed before the lock's local deadline"
LOST_BY_STORE = "the store no longer has this lock's token (it expired or was taken over)"
LOST_BY_FORK = (
    "this process was forked from the one that acquired the lock; that process still holds it"
)


def safety_margin(ttl: float) -> float:
    """How much earlier than the store's expiry a holder stops trusting its lease.

    A tenth of the TTL, at most two seconds: room for the store's clock to run
    a little faster than ours and for a reply that arrives late.
    """
    return min(ttl * 0.1, 2.0)


HANDOVER_GRACE = 1.0
"""Seconds a lease handed over by a release is trusted locally (past the safety
margin) before its new holder's first renewal must have been confirmed."""

SAY_WAIT = 1.0
"""Seconds a release waits at most for another thread to finish saying the
lock's loss (a log line and the event hooks), so that its event comes second."""


def handover_lease(ttl: float) -> float:
    """How long a lease that a release hands to a queued waiter lasts unrenewed.

    The new holder's renewer extends it to the TTL at once (its renewal is due
    on arrival). Short, so that a waiter that died while queued keeps the name
    from others for a second or two rather than a whole TTL; longer than the
    safety margin by ``HANDOVER_GRACE``, so the new holder can trust it.
    """
    return min(ttl, safety_margin(ttl) + HANDOVER_GRACE)


def renew_interval(ttl: float) -> float:
    return ttl / 3


_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class LeaseState:
    """What the holder and the renewer share about one grant.

    A plain slotted class, held by each ``Lock``: one is made per acquire, on
    the hot path. ``loss`` is why the lease was lost, or None. ``on_lost`` is
    called once, outside the guard, when it is lost (the service's event):
    by the thread that found the loss, or by a release that came first (see
    :meth:`say_lost`).
    """

    __slots__ = (
        "deadline",
        "fence",
        "guard",
        "loss",
        "name",
        "on_lost",
        "released",
        "renew_at",
        "saying",
        "token",
        "ttl",
        "unsaid",
        "waiters",
    )

    def __init__(
        self,
        name: str,
        token: str,
        ttl: float,
        sent: float,
        guard: threading.Lock,
        *,
        fence: int = 0,
        on_lost: Callable[[LeaseState, str], None] | None = None,
    ) -> None:
        self.name = name
        self.token = token
        self.ttl = ttl
        self.fence = fence
        self.on_lost = on_lost
        self.deadline = sent + ttl - safety_margin(ttl)
        self.renew_at = sent + ttl / 3  # renew_interval(ttl), inlined: one grant, one call less
        # Shared by every lease of a service (see Renewer.lease_guard): held
        # only for a few attribute updates, and one allocation less per grant.
        self.guard = guard
        self.released = False
        self.loss: str | None = None
        self.unsaid = False  # a loss whose log line and on_lost are still to come
        self.saying: tuple[int, threading.Event] | None = None  # who says it; set once said
        self.waiters: list[_Waiter] | None = None  # made by the first loss waiter

    def alive(self) -> bool:
        """Held right now. Marks the lease lost when its deadline has passed."""
        if self.released or self.loss is not None:
            return False
        if time.monotonic() < self.deadline:
            return True
        self.lose(LOST_BY_DEADLINE)
        return False

    def lose(self, reason: str) -> None:
        with self.guard:
            newly = self._lose_locked(reason)
        if newly:
            self.say_lost()

    def say_lost(self) -> None:
        """Say the loss (its log line, ``on_lost``) once, whichever thread comes
        first: the one that found it, or a release of the lock, which a waiter
        the loss woke may make before that thread gets here. A release that
        finds another thread saying it waits until it is said (at most
        ``SAY_WAIT``), so that the release's event follows the loss's, as it
        happened."""
        with self.guard:
            reason = self.loss if self.unsaid else None
            self.unsaid = False
            if reason is not None:
                self.saying = (threading.get_ident(), threading.Event())
            saying = self.saying
        if saying is None:
            return
        sayer, said = saying
        if reason is not None:
            try:
                self._lost(reason)
            finally:
                said.set()
        elif sayer != threading.get_ident():  # (an on_lost that releases: no wait for itself)
            said.wait(SAY_WAIT)

    def _lost(self, reason: str) -> None:
        # Outside the guard, which every lease of the service shares: a log
        # handler or an event hook may itself read some lock's state.
        log.warning("lock %r lost: %s", self.name, reason)
        if self.on_lost is not None:
            self.on_lost(self, reason)

    def _lose_locked(self, reason: str) -> bool:
        if self.released or self.loss is not None:
            return False
        self.loss = reason
        self.unsaid = True
        if self.waiters:
            self._wake_locked()
        return True

    def mark_released(self) -> bool:
        """Stop renewing. Returns whether the lease was still held locally."""
        with self.guard:
            if self.released:
                return False
            was_held = self.loss is None and time.monotonic() < self.deadline
            if not was_held and self.loss is None:
                self.loss = LOST_BY_DEADLINE
            self.released = True
            if self.waiters:
                self._wake_locked()
            return was_held

    def abandon_in_fork(self) -> None:
        """In a forked child: no longer held here, never released from here.

        Takes no guard: a thread of the parent may have held it at the fork,
        and that thread does not exist in the child.
        """
        self.guard = threading.Lock()
        self.waiters = None
        if not self.released and self.loss is None:
            self.loss = LOST_BY_FORK
        self.released = True  # so release() sends nothing: the parent's grant stays the parent's

    def extend(self, sent: float) -> None:
        """Record a renewal that was sent at ``sent`` and confirmed."""
        with self.guard:
            if self.released or self.loss is not None:
                return
            # Confirmed too late: someone may already have seen it lost, and
            # a lost lock never comes back.
            late = time.monotonic() >= self.deadline
            if late:
                late = self._lose_locked(LOST_BY_DEADLINE)
            else:
                self.deadline = sent + self.ttl - safety_margin(self.ttl)
                self.renew_at = sent + renew_interval(self.ttl)
        if late:
            self._lost(LOST_BY_DEADLINE)

    def add_waiter(self, waiter: _Waiter) -> float | None:
        """Register a loss waiter; returns seconds to the deadline, None if not held."""
        if not self.alive():
            return None
        with self.guard:
            if self.released or self.loss is not None:
                return None
            if self.waiters is None:
                self.waiters = []
            self.waiters.append(waiter)
            return self.deadline - time.monotonic()

    def remove_waiter(self, waiter: _Waiter) -> None:
        with self.guard:
            if self.waiters is not None and waiter in self.waiters:
                self.waiters.remove(waiter)

    def _wake_locked(self) -> None:
        waiters, self.waiters = self.waiters or [], None
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(settle, future)
            except RuntimeError:  # the waiter's loop is closed
                pass
