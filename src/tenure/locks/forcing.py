"""An operator's forced release: free a lock whoever holds it, and leave an
audit record and an event.

``LockService.force_release`` (bound there), kept here as one concern; the
CLI's ``tenure release NAME --force`` calls it.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from .. import _validate
from ..errors import InvalidArgument, StoreUnavailable
from ..events import Event, EventKind
from ..stores.audit import ForcedRelease, operator_id

if TYPE_CHECKING:
    from .service import LockService

__all__ = ("force_release",)


async def force_release(
    self: LockService, name: str, *, operator: str | None = None, reason: str | None = None
) -> ForcedRelease | None:
    """Free the lock ``name`` whoever holds it: an operator's action on a stale lock.

    Returns the audit record it left in the store's run log
    (``store.runlog.forced_releases()``), or None when nothing live was held
    (or the lock changed hands meanwhile: look again); nothing is recorded
    then. The evicted holder loses the lock at its next renewal, and every
    later grant has a larger fencing token, so fenced resources refuse its
    writes. Emits a ``forced_release`` event. ``operator`` names who freed
    it (default ``user@host:pid``); ``reason`` is kept with the record.

    Raises StoreUnavailable if the store cannot be reached; if the lock was
    freed but its record could not be written, the error says so.
    """
    _validate.check_name(name)
    if operator is not None and (not isinstance(operator, str) or not operator.strip()):
        raise InvalidArgument(f"operator must be a non-empty string, got {operator!r}")
    if reason is not None and not isinstance(reason, str):
        raise InvalidArgument(f"reason must be a string or None, got {reason!r}")
    evicted = await self.store.force_release(name)
    if evicted is None:
        return None
    record = ForcedRelease(
        secrets.token_hex(8),
        name,
        time.time(),
        operator or operator_id(),
        evicted.holder,
        evicted.fencing_token,
        reason,
    )
    self.emit(
        Event(
            EventKind.FORCED_RELEASE,
            name,
            self.holder,
            evicted.fencing_token,
            detail=f"{record.operator} evicted {evicted.holder}",
        )
    )
    try:
        await self.store.runlog.record_forced(record)
    except StoreUnavailable as exc:
        raise StoreUnavailable(
            f"lock {name!r} was freed (evicted {evicted.holder}, fencing token "
            f"{evicted.fencing_token}) but its audit record could not be written: {exc}"
        ) from exc
    return record
