"""What a store holds, read by a test whose application runs in other processes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenure.control.records import TASKS, Registration, decode
from tenure.stores import from_url
from tenure.stores.base import Store
from tenure.stores.runlog import PRESENCE_PREFIX, RunRecord

T = TypeVar("T")


def _read(url: str, read: Callable[[Store], Awaitable[T]]) -> T:
    async def opened() -> T:
        store = from_url(url)
        try:
            return await read(store)
        finally:
            await store.aclose()

    return asyncio.run(opened())


def serving(url: str) -> set[str]:
    """The instances whose presence lease is held: those serving a scheduler."""

    async def read(store: Store) -> set[str]:
        return {i.holder for i in await store.holders(PRESENCE_PREFIX)}

    return _read(url, read)


def held(url: str) -> list[str]:
    """The locks held, presence leases left out."""

    async def read(store: Store) -> list[str]:
        return [i.name for i in await store.holders("") if not i.name.startswith(PRESENCE_PREFIX)]

    return _read(url, read)


def runs(url: str, task: str) -> list[RunRecord]:
    """The newest 100 run records of ``task``."""

    async def read(store: Store) -> list[RunRecord]:
        return await store.runlog.runs(task, limit=100)

    return _read(url, read)


def registered(url: str) -> dict[str, str]:
    """The tasks the schedulers registered for ``tenure.control``: name -> schedule."""

    async def read(store: Store) -> dict[str, str]:
        entries = await store.runlog.board(TASKS)
        return {
            key: decode(Registration, TASKS, key, value).schedule for key, value in entries.items()
        }

    return _read(url, read)
