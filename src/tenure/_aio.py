"""asyncio helpers shared by the service and the stores."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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


async def woken_within(future: asyncio.Future[None], timeout: float) -> bool:
    """Wait for a wake-up future of our own, at most ``timeout`` seconds; whether
    it was woken (False: the time ran out).

    ``asyncio.wait_for`` would cost a handoff two more turns of the event loop
    (its inner waiter and callback); here the timer settles the future itself,
    which only its waiter reads. Cancelling the caller cancels the future.
    """
    if future.done():
        return True
    timed_out = False

    def time_up() -> None:
        nonlocal timed_out
        if not future.done():
            timed_out = True
            future.set_result(None)

    timer = asyncio.get_running_loop().call_later(timeout, time_up)
    try:
        await future
    finally:
        timer.cancel()
    return not timed_out


def settle(future: asyncio.Future[None]) -> None:
    """Resolve a wake-up future unless it is done (woken, timed out or cancelled)."""
    if not future.done():
        future.set_result(None)


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine (partials and async ``__call__`` included)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an async __call__ makes an async callable
    )


class Background:
    """Tasks left to finish on their own (a give-back, a withdrawal), each
    referenced until done so that it is not collected mid-flight."""

    __slots__ = ("tasks",)

    def __init__(self) -> None:
        self.tasks: set[asyncio.Future[Any]] = set()

    def start(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def finish(self) -> None:
        """Wait for every task still running; their errors are theirs."""
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
