"""``tenure release NAME --force``: free a lock whoever holds it, with a
confirmation and an audit record."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
import time

from ..errors import ConfigurationError
from ..stores import from_url as store_from_url
from ..stores.runlog import RunRecord


async def force_release(url: str, name: str, yes: bool) -> int:
    store = store_from_url(url)
    try:
        info = await store.holder_of(name)
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
        evicted = await store.force_release(name)
        if evicted is None:
            print(f"lock {name!r} was released or changed hands meanwhile: nothing freed")
            return 1
        now = time.time()
        operator = f"{os.environ.get('USER') or os.getuid()}@{socket.gethostname()}:{os.getpid()}"
        note = (
            f"forced free by {operator}: evicted {evicted.holder} "
            f"(fencing token {evicted.fencing_token})"
        )
        record = RunRecord(
            secrets.token_hex(8), f"tenure.release:{name}", None, operator, now, now, "forced", note
        )
        await store.runlog.record_run(record, keep=100)
        print(
            f"freed {name!r}: evicted {evicted.holder} (fencing token {evicted.fencing_token}). "
            "It loses the lock at its next renewal; every later grant has a larger token, "
            "so fenced resources refuse its writes. Recorded: tenure tasks --task "
            f"'tenure.release:{name}'"
        )
        successor = await store.holder_of(name)
        if successor is not None:
            # On Redis the release itself hands the lock to a queued waiter.
            print(
                f"{name!r} went straight to a waiter: now held by {successor.holder} "
                f"(fencing token {successor.fencing_token})"
            )
        return 0
    finally:
        await store.aclose()
