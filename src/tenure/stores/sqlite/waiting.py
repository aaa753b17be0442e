"""Waiting for a SQLite lease: each waiter is sent a datagram by the release.

A waiter binds a unix datagram socket in Linux's abstract namespace and
registers its address in ``<prefix>_waiters``; the release statement returns
the registered addresses and the releaser sends each one a datagram. A
semaphore's waiters register the same way, under the semaphore's key
(``Datagrams``), and a permit's release that leaves waiters queued sends theirs. A waiter
also wakes when the current lease expires. On systems without abstract
sockets, waiters poll every 10 ms instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import sys
import time
from typing import TYPE_CHECKING

from ..semaphores import Changes
from .database import Database

if TYPE_CHECKING:
    from .leases import Statements

__all__ = ("ABSTRACT_SOCKETS", "Datagrams", "Notifier", "wait_released")

ABSTRACT_SOCKETS = sys.platform.startswith("linux")
_POLL_FALLBACK = 0.010
_FAR_FUTURE_NS = 2**62
_REGISTERED_NS = 3600 * 10**9


class Notifier:
    """The socket a store's releases send their wake-ups from."""

    def __init__(self) -> None:
        self._sender: socket.socket | None = None

    def notify(self, addresses: list[str]) -> None:
        sender = self._sender
        if sender is None:
            sender = self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sender.setblocking(False)
        for address in addresses:
            try:
                sender.sendto(b"r", "\0" + address)
            except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
                # A full buffer already holds a wake-up; a missing socket is a
                # waiter that died, whose row pruning removes.
                pass
            except OSError:
                pass

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None


class Datagrams(Changes):
    """A semaphore's wake-ups (``Permits.changes``): a socket registered in
    ``<prefix>_waiters`` under the semaphore's key while entered."""

    def __init__(self, db: Database, prefix: str, key: str) -> None:
        self.db = db
        self.prefix = prefix
        self.key = key
        self.address = f"tenure-{os.getpid()}-{secrets.token_hex(8)}"
        self.sock: socket.socket | None = None

    def __enter__(self) -> Datagrams:
        if ABSTRACT_SOCKETS:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.bind("\0" + self.address)
            self.sock = sock
            # Pruned an hour on if its process died without taking it back; a
            # waiter that waits longer still calls again, just unwoken.
            self.db.run(
                f"INSERT INTO {self.prefix}_waiters (addr, name, until) VALUES (?, ?, ?)",
                (self.address, self.key, time.monotonic_ns() + _REGISTERED_NS),
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sock is not None:
            try:
                self.db.run(f"DELETE FROM {self.prefix}_waiters WHERE addr = ?", (self.address,))
            finally:
                self.sock.close()

    async def wait(self, timeout: float) -> None:
        if self.sock is None:
            await asyncio.sleep(min(timeout, _POLL_FALLBACK))
            return
        loop = asyncio.get_running_loop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # (wait_for may drop a cancel on 3.11)
                await loop.sock_recv(self.sock, 16)


async def wait_released(db: Database, sql: Statements, name: str, timeout: float) -> None:
    """Return when ``name`` may be free: woken by a release's datagram, or at
    the lease's expiry, or after ``timeout``."""
    if not ABSTRACT_SOCKETS:
        await asyncio.sleep(min(timeout, _POLL_FALLBACK))
        return
    address = f"tenure-{os.getpid()}-{secrets.token_hex(8)}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        sock.bind("\0" + address)
        now = time.monotonic_ns()
        until = now + int(timeout * 1e9) if timeout < 1e9 else _FAR_FUTURE_NS
        rows = db.run(sql.wait, (address, name, until))
        try:
            expires = rows[0][0] if rows else None
            if expires is None or expires <= now:
                return
            timeout = min(timeout, (expires - now) / 1e9)
            loop = asyncio.get_running_loop()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # (wait_for may drop a cancel on 3.11)
                    await loop.sock_recv(sock, 16)
        finally:
            db.run(sql.unwait, (address,))
    finally:
        sock.close()
