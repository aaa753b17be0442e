"""Statement deadlines: a watchdog severs the connection of a statement past ``timeout``.

Cancelling a psycopg query instead would wait up to ten more seconds for a
server that does not answer, and psycopg's blocking calls cannot be
interrupted at all; shutting the socket down fails the statement at once.
One watchdog per store (a task for the asyncio paths, a thread for the
blocking ones) checks every statement in flight four times per ``timeout``,
instead of a timer per statement.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import psycopg

__all__ = ("InFlight", "sever", "sever_overdue", "watch_statements")


class InFlight:
    """Statements running on one connection, for the watchdog (see ``_deadline``)."""

    __slots__ = ("conn", "fired", "registry", "started")

    def __init__(self, registry: set[InFlight], conn: psycopg.BaseConnection[Any]) -> None:
        self.registry = registry
        self.conn = conn
        self.started = time.monotonic()
        self.fired = False

    def __enter__(self) -> InFlight:
        self.registry.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.registry.discard(self)


def sever(conn: psycopg.BaseConnection[Any]) -> None:
    """Shut the connection's socket down so that a statement waiting on it fails now.

    shutdown() acts on the socket whatever family the duplicate is given, so
    this serves TCP and unix-socket connections alike.
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return
    with contextlib.suppress(OSError), socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
        s.shutdown(socket.SHUT_RDWR)


def sever_overdue(in_flight: set[InFlight], timeout: float) -> None:
    """Sever the connection of every statement in ``in_flight`` older than ``timeout``."""
    overdue = time.monotonic() - timeout
    # list(): a copy made in one step, while other threads add and discard.
    for statement in list(in_flight):
        if statement.started < overdue and not statement.fired:
            statement.fired = True
            sever(statement.conn)


def watch_statements(in_flight: set[InFlight], timeout: float, stop: threading.Event) -> None:
    """The blocking paths' watchdog thread: until ``stop`` is set."""
    while not stop.wait(timeout / 4):
        sever_overdue(in_flight, timeout)
