"""Waiting for a SQLite lease: each waiter is sent a datagram by the release.

A waiter binds a unix datagram socket in Linux's abstract namespace and
registers its address in ``<prefix>_waiters``; the release statement returns
the registered addresses and the releaser sends each one a datagram. A
waiter also wakes when the current lease expires. A semaphore's waiter
registers nothing: it listens at an address made from its token
(``Datagrams``), and a permit's release sends a datagram to the waiters
its freed permits reach, whose tokens the ledger holds. On systems without
abstract sockets, waiters poll every 10 ms instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
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

__all__ = ("ABSTRACT_SOCKETS", "Datagrams", "Notifier", "turn_address", "wait_released")

ABSTRACT_SOCKETS = sys.platform.startswith("linux")
_POLL_FALLBACK = 0.010
_FAR_FUTURE_NS = 2**62


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


def turn_address(token: str) -> str:
    """The socket a semaphore waiter listens on for its turn: named by a
    digest of its token (abstract socket names are visible to the host's
    users; the token is not), so that a release can reach it without a read."""
    return "tenure-turn-" + hashlib.sha256(token.encode()).hexdigest()[:32]


class Datagrams(Changes):
    """A semaphore waiter's wake-ups (``Permits.changes``): a release sends a
    datagram only to the waiters its freed permits reach, at the address
    ``turn_address`` of each one's token (bound once the waiter ``follow``s
    its token), so every datagram means "your turn may have come"."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None

    def follow(self, token: str) -> None:
        if ABSTRACT_SOCKETS and self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.setblocking(False)
                sock.bind("\0" + turn_address(token))
            except BaseException:
                sock.close()
                raise
            self.sock = sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    async def wait(self, timeout: float) -> bool:
        """A datagram (one read, one datagram), or the time ran out."""
        if self.sock is None:
            await asyncio.sleep(min(timeout, _POLL_FALLBACK))
            return False
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):  # (wait_for may drop a cancel on 3.11)
                await loop.sock_recv(self.sock, 16)
        except TimeoutError:
            return False
        return True


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
