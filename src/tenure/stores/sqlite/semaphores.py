"""The SQLite store's semaphores: one row per semaphore, its ledger in a blob.

Each call is one statement, so one atomic step and one commit, as a lock's
acquire is: an ``UPDATE`` whose new ledger is computed by the SQL function
``tenure_ledger(name, ledger)``, which applies the rules of
``tenure.stores.semaphores`` (``Ledger``) in Python, inside the statement
(SQLite runs a write statement alone). A semaphore seen for the first time
takes one ``INSERT ... ON CONFLICT`` more. The ledger is ``marshal``'s
encoding of ``Ledger.dump()``: a tenth of JSON's cost each way; a ledger
read back exactly as this connection last wrote it is not decoded again.

Expiry is ``CLOCK_MONOTONIC`` nanoseconds, as for leases (a reboot clears the
permits and waiters, keeping each fencing counter: see ``schema``). Waiters
are woken by a datagram (``waiting.Datagrams``): a release sends one to each
waiter its freed permits reach (``Ledger.reached``), at an address made from
that waiter's token, so a release costs the waiters behind nothing; they
also call again at least every third of a queue entry's life.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from ..base import Grant, RenewItem
from ..semaphores import Changes, Ledger, Permits, Queued, SemaphoreState
from .database import Database
from .waiting import Datagrams, Notifier, turn_address

__all__ = ("SQLitePermits",)

T = TypeVar("T")

_NS = 1e9

Change = Callable[[str, Ledger], Any]
"""What a statement does to each semaphore row it touches: changes the ledger
in place and returns that row's answer."""


def _load(blob: bytes | None) -> Ledger:
    return Ledger() if blob is None else Ledger.load(marshal.loads(blob))


_DECODED_MOST = 256
"""Ledgers a connection keeps decoded, as it last wrote them."""


class _Step:
    """``tenure_ledger`` of one connection, and the answers of its statement."""

    def __init__(self) -> None:
        self.change: Change | None = None
        self.answers: dict[str, Any] = {}
        self.failure: BaseException | None = None
        self._decoded: dict[str, tuple[bytes, Ledger]] = {}
        """Per name, the ledger this connection last wrote and its encoding:
        read back unchanged (no other process wrote it since, no rollback
        undid it), it is not decoded again."""

    def __call__(self, name: str, blob: bytes | None) -> bytes | None:
        assert self.change is not None
        kept = self._decoded.pop(name, None)
        ledger = kept[1] if kept is not None and kept[0] == blob else _load(blob)
        try:
            self.answers[name] = self.change(name, ledger)
        except Exception as exc:  # raised after the statement; the row is left as it was
            self.failure = exc
            return blob
        written = marshal.dumps(ledger.dump())
        if len(self._decoded) >= _DECODED_MOST:
            self._decoded.clear()
        self._decoded[name] = (written, ledger)
        return written


class SQLitePermits(Permits):
    """``store.semaphores`` of a SQLite store."""

    def __init__(self, db: Database, prefix: str, data_key: str, notifier: Notifier) -> None:
        self.db = db
        self.prefix = prefix
        self.data_key = data_key
        self.notifier = notifier
        self._local = threading.local()  # this thread's connection, and its _Step
        self._read = f"SELECT ledger FROM {prefix}_semaphores WHERE name = ?"
        change = f"UPDATE {prefix}_semaphores SET ledger = tenure_ledger(name, ledger) "
        self._update_one = change + "WHERE name = ?"
        self._update_many = change + "WHERE name IN (SELECT value FROM json_each(?))"
        self._insert = (
            f"INSERT INTO {prefix}_semaphores (name, ledger) "
            "VALUES (?1, tenure_ledger(?1, NULL)) ON CONFLICT (name) DO NOTHING"
        )

    def _step(self) -> tuple[sqlite3.Connection, _Step]:
        conn = self.db.conn()
        local = self._local
        if (
            getattr(local, "conn", None) is not conn
        ):  # this thread's first call, or a new connection
            local.step = _Step()
            conn.create_function("tenure_ledger", 2, local.step)
            local.conn = conn
        step: _Step = local.step
        return conn, step

    def _apply(self, names: Sequence[str], change: Change, *, create: bool) -> dict[str, Any]:
        """Run ``change`` on the ledgers of ``names`` in one statement (and, with
        ``create``, one more for a name without a row); each row's answer."""
        _, step = self._step()
        step.change, step.answers, step.failure = change, {}, None
        db = self.db
        try:
            cur = db.cursor()
            if len(names) == 1:
                cur.execute(self._update_one, (names[0],))
            else:
                cur.execute(self._update_many, (json.dumps(list(names)),))
            if create and not step.answers and step.failure is None:
                cur.execute(self._insert, (names[0],))
                if not step.answers and step.failure is None:  # another process inserted it
                    cur.execute(self._update_one, (names[0],))
        except sqlite3.Error as exc:
            raise db.failed(exc) from exc
        finally:
            step.change = None
        if step.failure is not None:
            raise step.failure
        db.wrote()
        return step.answers

    async def acquire(
        self, name: str, token: str, ttl: float, holder: str, limit: int, *, queue: float
    ) -> Grant | Queued | None:
        now = time.monotonic_ns()
        ttl_ns, queue_ns = int(ttl * _NS), int(queue * _NS)
        answers = self._apply(
            (name,),
            lambda _, ledger: ledger.acquire(
                name, token, ttl_ns, holder, limit, queue=queue_ns, now=now
            ),
            create=True,
        )
        answer: Grant | Queued | None = answers.get(name)
        return answer

    async def release(self, name: str, token: str) -> bool:
        now = time.monotonic_ns()

        def release(_: str, ledger: Ledger) -> tuple[bool, list[str]]:
            return ledger.release(token, now), ledger.reached(now)

        released, reached = self._apply((name,), release, create=False).get(name, (False, []))
        if reached:  # the waiters the freed permit reaches, at their token's address
            self.notifier.notify([turn_address(t) for t in reached])
        return bool(released)

    def changes(self, name: str) -> contextlib.AbstractAsyncContextManager[Changes]:
        return _entered(Datagrams())

    async def renew(self, batch: Sequence[RenewItem]) -> list[bool]:
        if not batch:
            return []
        now = time.monotonic_ns()
        by_name: dict[str, list[int]] = {}
        for i, item in enumerate(batch):
            by_name.setdefault(item.name, []).append(i)

        def renew(name: str, ledger: Ledger) -> list[bool]:
            return [
                ledger.renew(batch[i].token, int(batch[i].ttl * _NS), now) for i in by_name[name]
            ]

        answers = self._apply(list(by_name), renew, create=False)
        results = [False] * len(batch)
        for name, indices in by_name.items():
            for i, ok in zip(indices, answers.get(name, ()), strict=False):
                results[i] = ok
        return results

    async def state(self, name: str) -> SemaphoreState:
        rows = self.db.run(self._read, (name,))
        return _load(rows[0][0] if rows else None).state(name, time.monotonic_ns(), _NS)


@contextlib.asynccontextmanager
async def _entered(datagrams: Datagrams) -> AsyncIterator[Changes]:
    try:
        yield datagrams
    finally:
        datagrams.close()
