"""One translation of driver errors into StoreUnavailable, for every store.

Every store names itself the same way in the message (``Redis at URL``, with
the password masked) and keeps the driver's exception as ``__cause__``, so a
caller sees one kind of failure whatever the driver, and a log shows the
driver's own words.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from ..errors import StoreUnavailable

__all__ = ("Translated",)


class Translated:
    """``with translated:`` turns the driver's ``errors`` into StoreUnavailable.

    A class with ``__enter__``/``__exit__`` rather than a generator-based
    context manager: it is entered on every call of a store, hot paths
    included, and costs a third as much.
    """

    __slots__ = ("errors", "said", "where")

    def __init__(
        self,
        errors: tuple[type[BaseException], ...],
        where: str,
        said: Callable[[BaseException], str] = str,
    ) -> None:
        self.errors = errors
        self.where = where
        """The store as messages name it: ``Redis at redis://host:6379/0``."""
        self.said = said
        """The driver's words for one of its errors, in a message."""

    def unavailable(self, exc: BaseException, what: str = "failed") -> StoreUnavailable:
        """The StoreUnavailable for ``exc`` (the caller raises it ``from exc``)."""
        return StoreUnavailable(f"{self.where} {what}: {self.said(exc)}")

    def __enter__(self) -> Translated:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and isinstance(exc, self.errors):
            raise self.unavailable(exc) from exc
