"""Waiting for a Redis lease: release notifications, and the hand-over queue.

* Waiters that are not queued subscribe to the lease's release channel before
  they look at the lease again, so a release between the two cannot be
  missed; they also wake when the lease's remaining time (``PTTL``) runs out.
  The store keeps one pub/sub connection; a channel stays subscribed a few
  seconds after its last waiter left.
* Grant on release: one waiter per lock queues itself (``...:next``, with its
  token) in the script that finds the lock held (``enlist.lua``), and calls
  again every third of ``QUEUE_LIFE`` to keep its entry alive. The release
  script hands the lease straight to it and pushes a note onto ``...:handed``,
  on which the waiter blocks in ``BLPOP``: it holds the lock as soon as it
  reads the note, with no round trip of its own. The handed-over lease is
  short (``tenure.lease.handover_lease``: the new holder's renewer extends it at
  once), so a queued waiter that died costs the name a second or two, not a
  whole TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..._aio import Background, woken_within
from ..._tokens import new_token
from ...errors import StoreUnavailable
from .._waiters import QUEUE_LIFE, Wakeups
from ..base import Grant, HandedOver
from .cancels import cancel_requests, raise_swallowed_cancel
from .scripts import Enlisted, Keys
from .transport import DRIVER_ERRORS, Transport

__all__ = ("Releases", "Waiting")

log = logging.getLogger("tenure.stores.redis")

_UNSUBSCRIBE_AFTER = 5.0
"""Seconds a release channel stays subscribed after its last waiter left."""


class Releases:
    """The store's one pub/sub connection: which waiters a release wakes."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.waiting: Wakeups[bytes] = Wakeups()
        self.confirmed: dict[bytes, asyncio.Event] = {}
        self._pubsub: Any = None
        self._subscribing: asyncio.Lock | None = None
        self._listener: asyncio.Task[None] | None = None
        self._unsubscribing = Background()
        """UNSUBSCRIBEs, and closes of failed pub/sub connections."""

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self._unsubscribing.finish()

    def forget(self, channel: bytes, woken: asyncio.Future[None]) -> None:
        """A waiter of ``channel`` is done with its wake-up future."""
        self.waiting.remove(channel, woken)
        if channel not in self.waiting:
            self._unsubscribe(channel)

    async def subscribed(self, channel: bytes, timeout: float) -> bool:
        """Subscribe to ``channel`` and wait for the server's confirmation; False on timeout.

        Subscribed (confirmed) first, then look at the lease: a release in
        between cannot be missed.
        """
        with self.transport.translated:
            try:
                confirmed = await self._subscribe(channel)
                # asyncio.timeout: on 3.11 wait_for can drop a cancellation that
                # comes as the confirmation does, and the waiter would wait on.
                async with asyncio.timeout(min(max(timeout, 0.0), 3600.0)):
                    await confirmed.wait()
            except TimeoutError:
                return False
        return True

    async def _subscribe(self, channel: bytes) -> asyncio.Event:
        """Subscribe the pub/sub connection to ``channel``; its confirmation.

        One waiter at a time: the listener may only start reading once a first
        SUBSCRIBE has given the pub/sub object its connection.
        """
        before = cancel_requests()
        if self._subscribing is None:
            self._subscribing = asyncio.Lock()
        async with self._subscribing:
            if self._pubsub is None:
                if self.transport.cluster:
                    # A cluster client's pub/sub needs the slot map, which a
                    # client used only for waiting (tenure.sync) has not loaded.
                    await self.transport.client.initialize()
                self._pubsub = self.transport.client.pubsub()
            confirmed = self.confirmed.get(channel)
            if confirmed is None:
                confirmed = self.confirmed[channel] = asyncio.Event()
                pubsub = self._pubsub
                try:
                    await pubsub.subscribe(channel)
                except BaseException:
                    # The connection failed under the SUBSCRIBE (a server
                    # restarting): the next waiter opens a new one, rather than
                    # wait for a confirmation that cannot come.
                    self._drop(pubsub)
                    raise
            if self._listener is None or self._listener.done():
                self._listener = asyncio.ensure_future(self._listen(self._pubsub))
        # Subscribed (the listener confirms it for later waiters) and cancelled.
        raise_swallowed_cancel(before)
        return confirmed

    def _unsubscribe(self, channel: bytes) -> None:
        """Unsubscribe ``channel`` a little later, if nobody waits on it by then.

        Not at once: the waiter that just woke is about to acquire, and the
        UNSUBSCRIBE would compete with that acquire for the loop; and a name
        waited on once is often waited on again.
        """
        asyncio.get_running_loop().call_later(_UNSUBSCRIBE_AFTER, self._unsubscribe_idle, channel)

    def _unsubscribe_idle(self, channel: bytes) -> None:
        if channel in self.waiting or self.confirmed.pop(channel, None) is None:
            return  # waited on again, or the connection was replaced meanwhile
        if self._pubsub is not None:
            self._unsubscribing.start(_quietly(self._pubsub.unsubscribe(channel)))

    async def _listen(self, pubsub: Any) -> None:
        """Read the pub/sub connection: confirm subscriptions, wake waiters on releases."""
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                channel = message["channel"]
                if message["type"] == "subscribe":
                    confirmed = self.confirmed.get(channel)
                    if confirmed is not None:
                        confirmed.set()
                elif message["type"] == "message":
                    self.waiting.wake(channel)
        except (*DRIVER_ERRORS, RuntimeError) as exc:  # RuntimeError: it has no connection
            log.debug("the Redis pub/sub connection failed, waiters re-check: %s", exc)
        finally:
            self._drop(pubsub)

    def _drop(self, pubsub: Any) -> None:
        """Whatever ended ``pubsub``'s connection: every waiter wakes to re-check,
        and the next wait opens a new one."""
        if self._pubsub is pubsub:
            self._pubsub = None
            self.confirmed.clear()
        self.waiting.wake_all()
        self._unsubscribing.start(_quietly(pubsub.aclose()))


class Waiting:
    """``wait_released`` and ``acquire_waiting`` of one store (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        keys: Keys,
        release: Callable[[str, str], Awaitable[bool]],
    ) -> None:
        self.transport = transport
        self.keys = keys
        self.release = release
        self.releases = Releases(transport)
        self._popping = 0
        """Queued waiters in BLPOP now: at most ``pool_max`` (the rest wait on pub/sub)."""
        self._withdrawing = Background()

    async def aclose(self) -> None:
        await self._withdrawing.finish()
        await self.releases.aclose()

    async def wait_released(self, name: str, timeout: float) -> None:
        channel = self.keys.channel(name).encode()
        releases = self.releases
        woken = releases.waiting.add(channel)
        try:
            if not await releases.subscribed(channel, timeout):
                return
            remaining_ms = await self.transport.call("pttl", self.keys.lease(name))
            if remaining_ms < 0:  # -2: no lease; -1 cannot happen (always PEXPIREd)
                return
            await woken_within(woken, min(timeout, remaining_ms / 1000))
        finally:
            releases.forget(channel, woken)

    async def acquire_waiting(
        self, name: str, token: str, ttl: float, holder: str, *, timeout: float, handover: float
    ) -> HandedOver | None:
        script = self.transport.script
        releases = self.releases
        tag = self.keys.tag(name)
        keys = (tag + ":lease", tag + ":fence", tag + ":next")
        handed = tag + ":handed"
        waiter = new_token()[:16]  # public: it names this waiter on the hand-over list
        args = (
            token,
            max(1, round(ttl * 1000)),
            holder,
            waiter,
            round(QUEUE_LIFE * 1000),
            max(1, round(handover * 1000)),
        )
        mine = waiter.encode() + b"|"
        deadline = time.monotonic() + timeout
        channel = (tag + ":released").encode()
        woken: asyncio.Future[None] | None = None
        queued_at: float | None = None
        """When the last call that left this waiter queued was sent."""
        called = False
        try:
            while True:
                sent = time.monotonic()
                called = True
                answer = await script("enlist", keys, args)
                code = answer[0]
                if code == Enlisted.GRANTED:
                    return HandedOver(Grant(int(answer[1])), sent, ttl)
                if code == Enlisted.HANDED_OVER:  # its note is still on the list
                    return HandedOver(Grant(int(answer[1])), sent, answer[2] / 1000)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # The lease's expiry (a crashed holder) wakes every waiter too.
                wake = min(left, max(answer[1], 1) / 1000)
                if code == Enlisted.QUEUED:
                    # The release hands us the lease; we call again before our
                    # entry lapses.
                    queued_at = sent
                    wake = min(wake, QUEUE_LIFE / 3)
                if code == Enlisted.QUEUED and self._popping < self.transport.pool_max:
                    # The release notes the hand-over on the list we BLPOP.
                    self._popping += 1
                    try:
                        note = await self.transport.pop(handed, wake)
                    finally:
                        self._popping -= 1
                    if note is not None and note.startswith(mine):
                        # Its since counts from our call that just kept us queued,
                        # so sent + since is no later than the grant.
                        _, fence, since = note.split(b"|")
                        return HandedOver(Grant(int(fence)), sent + int(since) / 1000, handover)
                # Not queued, or as many queued waiters BLPOP as the pool allows:
                # woken by the release's message, a queued waiter learns of its
                # hand-over from its next call (HANDED_OVER).
                elif woken is None or channel not in releases.confirmed:
                    # Another waiter is queued: wake on any release, and look
                    # again once subscribed (a release may have come between).
                    woken = releases.waiting.add(channel, instead_of=woken)
                    if not await releases.subscribed(channel, left):
                        break
                else:
                    await woken_within(woken, wake)
                    woken = releases.waiting.add(channel, instead_of=woken)
            if queued_at is None:
                return None
            # Out of time: leave the queue; a lease handed over meanwhile is kept.
            sent = time.monotonic()
            answer = await script("withdraw", (keys[0], keys[2]), (token, waiter))
            if answer is None:
                return None
            return HandedOver(Grant(int(answer[0])), sent, answer[1] / 1000)
        except BaseException:
            if called:
                # Cancelled or failed with a call in flight or an entry queued:
                # the store may have queued us or handed us the lease.
                self._withdrawing.start(self._abandon(name, keys, token, waiter))
            raise
        finally:
            if woken is not None:
                releases.forget(channel, woken)

    async def _abandon(
        self, name: str, keys: tuple[str, str, str], token: str, waiter: str
    ) -> None:
        """Withdraw a waiter that gave up abnormally, and release what it may have been handed."""
        try:
            await self.transport.script("withdraw", (keys[0], keys[2]), (token, waiter))
            await self.release(name, token)
        except StoreUnavailable as exc:
            # Lapses by itself: the queue entry within QUEUE_LIFE, a
            # handed-over lease within its short hand-over lease.
            log.debug("could not withdraw an abandoned waiter of %r: %s", name, exc)


async def _quietly(call: Awaitable[Any]) -> None:
    try:
        await call
    except DRIVER_ERRORS as exc:
        log.debug("unsubscribing or closing the pub/sub connection failed: %s", exc)
