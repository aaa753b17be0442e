"""asyncio helpers shared by the service and the stores."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def shielded(awaitable: Awaitable[T]) -> T:
    """Await to completion even if the caller is cancelled meanwhile, then re-raise that."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError as exc:
            if task.done():
                raise
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    return result
