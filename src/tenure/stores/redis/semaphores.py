"""The Redis store's semaphores: a hash and sorted sets per semaphore, changed by Lua.

Each call is one script (``lua/sem_*.lua``, the rules of
``tenure.stores.semaphores``) over the semaphore's keys (``lua/_sem.lua``):
its permits, their expiries, its queue in arrival order, the queue entries'
lives, its limit and its fencing counter, all under one hash tag, so that a
semaphore lives in one slot of a cluster. Expiry is the server's ``TIME``;
fencing tokens are never below it in microseconds, as a lock's. A release
that leaves waiters queued publishes on the semaphore's channel, which they
hear through the store's one pub/sub connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from ...errors import LimitMismatch
from ..base import Grant, LeaseInfo, RenewItem
from ..semaphores import Changes, Heard, Permits, Queued, SemaphoreState
from .scripts import Keys, per_slot
from .transport import Transport, socket_timeout
from .waiting import Releases

__all__ = ("RedisPermits",)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisPermits(Permits):
    """``store.semaphores`` of a Redis store (a single server or a cluster)."""

    def __init__(self, transport: Transport, keys: Keys, releases: Releases, data_key: str):
        self.transport = transport
        self.keys = keys
        self.releases = releases
        self.data_key = data_key

    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        answer = await self.transport.script(
            "sem_acquire",
            self.keys.semaphore(name),
            (token, _ms(ttl), holder, limit, _ms(queue) if queue > 0 else 0),
        )
        code = int(answer[0])
        if code == 1:
            return Grant(int(answer[1]))
        if code == 2:
            return Queued(int(answer[1]))
        if code == -1:
            raise LimitMismatch(name, int(answer[1]), limit)
        return None

    async def release(self, name: str, token: str) -> bool:
        keys = self.keys.semaphore(name)[:4]  # its permits and queue only
        channel = self.keys.semaphore_channel(name)
        return bool(await self.transport.script("sem_release", keys, (token, channel)))

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        items = [(self.keys.semaphore(item.name)[1], (item.token, _ms(item.ttl))) for item in batch]
        answers = await per_slot(self.transport.script, self.transport.cluster, "sem_renew", items)
        return [bool(ok) for ok in answers]

    async def state(self, name: str) -> SemaphoreState:
        answer = await self.transport.script("sem_state", self.keys.semaphore(name), ())
        now_ms, limit, waiting = int(answer[0]), answer[1], int(answer[2])
        infos = []
        for expires, permit in zip(answer[3::2], answer[4::2], strict=True):
            fence, acquired, holder = permit.decode().split(" ", 2)
            expires_in = (float(expires) - now_ms) / 1000
            infos.append(LeaseInfo(name, holder, int(fence), expires_in, float(acquired)))
        infos.sort(key=lambda info: info.fencing_token)
        idle = not infos and not waiting
        return SemaphoreState(name, None if idle else int(limit), infos, waiting)

    @contextlib.asynccontextmanager
    async def changes(self, name: str) -> AsyncIterator[Changes]:
        channel = self.keys.semaphore_channel(name).encode()
        releases = self.releases
        changes = Heard(releases.waiting, channel)
        try:
            # Subscribed (confirmed) before the first acquire: a release in
            # between is heard.
            await releases.subscribed(channel, socket_timeout(self.transport.url))
            yield changes
        finally:
            releases.forget(channel, changes.woken)
