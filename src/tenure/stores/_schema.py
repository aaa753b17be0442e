"""What a store with tables (PostgreSQL, MySQL) says when it finds them of
another shape, and how its plain calls have them made."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..errors import ConfigurationError

__all__ = ("Schemed", "check_schema_version", "on_a_thread", "schema_on_a_thread")


def on_a_thread(work: Callable[[], Awaitable[None]], name: str) -> None:
    """Run ``work()`` to its end from a plain call (a blocking path creating
    or checking the tables through the asyncio transport's own steps: one
    definition of them and their errors), on an event loop of its own on a
    short-lived thread, since the caller's thread may be running a loop
    already. Its exception is raised here."""
    failed: list[BaseException] = []

    async def main() -> None:
        await work()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


class Schemed(Protocol):
    """A store's asyncio transport, as far as making its tables goes."""

    async def ensure_schema(self) -> None: ...

    async def aclose(self) -> None: ...


def schema_on_a_thread(make_transport: Callable[[], Schemed], store: str) -> None:
    """Create or check the tables from a plain call through a transport of
    their own (see ``on_a_thread``)."""

    async def ensure() -> None:
        transport = make_transport()
        try:
            await transport.ensure_schema()
        finally:
            await transport.aclose()

    on_a_thread(ensure, f"tenure-{store}-schema")


def check_schema_version(
    found: str | None, expected: int, where: str, tables: str, what_else: str = ""
) -> None:
    """ConfigurationError unless ``found`` (the recorded version) is ``expected``;
    an older one is named as such. ``tables`` names them in the message;
    ``what_else`` is what to drop beside them."""
    if found is not None and found.isdigit() and int(found) < expected:
        raise ConfigurationError(
            f"{where}: {tables} are of an older shape (schema version {found}; this "
            f"tenure uses {expected}): tenure has no release yet that migrates them. "
            f"Stop every instance, drop them{what_else} (they hold only leases, claims, run "
            "records, audit records and the control board) or use another prefix; `tenure schema` "
            "prints the current shape"
        )
    if found != str(expected):
        raise ConfigurationError(
            f"{where}: {tables} have schema version {found!r}, this tenure expects "
            f"{expected}; use another prefix"
        )
