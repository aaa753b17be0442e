"""``tenure release NAME --force``: free a lock whoever holds it, with a
confirmation and audit records (``tenure locks --forced``, ``tenure audit``)."""

from __future__ import annotations

import asyncio
import sys

from ..control import Control
from ..errors import ConfigurationError, InvalidArgument
from ..locks import LockService


async def force_release(url: str, name: str, yes: bool, reason: str | None) -> int:
    async with LockService.from_url(url) as service:
        info = await service.store.holder_of(name)
        if info is None:
            print(f"lock {name!r} is not held: nothing to free")
            return 1
        what = (
            f"lock {name!r} held by {info.holder} (fencing token {info.fencing_token}, "
            f"expires in {info.expires_in:.1f} s unless renewed)"
        )
        if not yes:
            if not sys.stdin.isatty():
                raise ConfigurationError(
                    f"refusing to free {what} without --yes: there is no terminal to ask on"
                )
            answer = await asyncio.to_thread(
                input, f"Free {what}? Its holder may still be running. [y/N] "
            )
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing freed")
                return 1
        try:
            record = await Control(service).force_release(name, reason=reason)
        except InvalidArgument:
            print(f"lock {name!r} was released or changed hands meanwhile: nothing freed")
            return 1
        print(
            f"freed {name!r}: evicted {record.evicted} (fencing token {record.fencing_token}). "
            "It loses the lock at its next renewal; every later grant has a larger token, "
            "so fenced resources refuse its writes. Recorded: tenure locks --forced"
        )
        successor = await service.store.holder_of(name)
        if successor is not None:
            # On Redis the release itself hands the lock to a queued waiter.
            print(
                f"{name!r} went straight to a waiter: now held by {successor.holder} "
                f"(fencing token {successor.fencing_token})"
            )
        return 0
