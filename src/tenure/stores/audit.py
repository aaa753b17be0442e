"""The audit record of a forced release: who freed which lock, from whom, and when.

``LockService.force_release`` (and ``tenure release NAME --force``) frees a
lock whoever holds it. Each one it made leaves a :class:`ForcedRelease` in the
store's run log (``RunLog.record_forced``), a record of its own kind beside the
scheduler's run records; ``RunLog.forced_releases`` and ``tenure locks
--forced`` read them back, newest first. A store keeps the newest
``FORCED_KEEP``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ("FORCED_KEEP", "ForcedRelease", "newest", "operator_id")

FORCED_KEEP = 1000
"""How many forced-release records a store keeps (the newest)."""

_Row = tuple[str, str, float, str, str, int, str | None]


@dataclass(frozen=True, slots=True)
class ForcedRelease:
    """One forced release of a lock."""

    record_id: str
    """Random id of this record."""
    name: str
    """The lock that was freed."""
    at: float
    """When (POSIX seconds)."""
    operator: str
    """Who freed it: ``user@host:pid`` unless the caller named itself."""
    evicted: str
    """The holder id (``host:pid:id``) of the grant it removed."""
    fencing_token: int
    """The removed grant's fencing token: every later grant's is larger."""
    reason: str | None = None
    """Why, as the operator gave it."""

    def row(self) -> _Row:
        """The fields in order, as every store writes them; :meth:`from_row` reads them back."""
        return (
            self.record_id,
            self.name,
            self.at,
            self.operator,
            self.evicted,
            self.fencing_token,
            self.reason,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ForcedRelease:
        return cls(*row)


def operator_id() -> str:
    """This process as the operator of a forced release: ``user@host:pid``."""
    user = os.environ.get("USER") or str(os.getuid())
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def newest(records: Iterable[ForcedRelease], name: str | None, limit: int) -> list[ForcedRelease]:
    """The newest ``limit`` of ``records`` (of the lock ``name``, or all), newest first."""
    chosen = [record for record in records if name is None or record.name == name]
    chosen.sort(key=lambda record: record.at, reverse=True)
    return chosen[:limit]
