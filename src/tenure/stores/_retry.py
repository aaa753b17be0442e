"""The one retry policy of every store: once, on a broken connection, never on a timeout.

A server that restarted closed every pooled connection; the first command on
each finds it broken before anything was sent or run, so sending it once more
on a new connection is safe and hides the restart from the caller. A command
that timed out is never sent again: it may have run, and an acquire sent twice
would find its own lease and report contention. Each store says which of its
driver's errors mean "broken" and what to drop before the second try.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ("once_more", "once_more_now", "retried")

T = TypeVar("T")

log = logging.getLogger("tenure.stores")


async def retried(
    call: Callable[[], Awaitable[T]],
    broken: Callable[[BaseException], bool],
    before_retry: Callable[[Exception], Awaitable[None]] | None = None,
) -> T:
    """``await call()``; once more if it raised an error ``broken`` says is a
    broken connection, after ``before_retry(error)`` (which drops what broke)."""
    try:
        return await call()
    except Exception as exc:
        return await once_more(exc, call, broken, before_retry)


async def once_more(
    failed: Exception,
    call: Callable[[], Awaitable[T]],
    broken: Callable[[BaseException], bool],
    before_retry: Callable[[Exception], Awaitable[None]] | None = None,
) -> T:
    """The second half of :func:`retried`, for a hot path that made its first
    attempt inline (a coroutine level less on every call): raises ``failed``
    unless ``broken`` says it is a broken connection; then ``before_retry``
    and ``call()`` once more."""
    if not broken(failed):
        raise failed
    log.debug("a store connection was broken, sending once more: %r", failed)
    if before_retry is not None:
        await before_retry(failed)
    return await call()


def once_more_now(
    failed: Exception,
    call: Callable[[], T],
    broken: Callable[[BaseException], bool],
    before_retry: Callable[[Exception], None] | None = None,
) -> T:
    """:func:`once_more` for a plain call."""
    if not broken(failed):
        raise failed
    log.debug("a store connection was broken, sending once more: %r", failed)
    if before_retry is not None:
        before_retry(failed)
    return call()
