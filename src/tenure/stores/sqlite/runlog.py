"""The SQLite store's run log: claims and run records as rows.

A claim is one row per task (``<prefix>_claims``), advanced by a
compare-and-advance upsert; run records are rows of ``<prefix>_runs``, one
column per ``RunRecord`` field; forced releases' audit records are rows of
``<prefix>_forced``, one column per ``ForcedRelease`` field; the control
board is ``<prefix>_board`` (kind, key, value). A batch (claims,
starts, records) is one write transaction: its items are committed together,
at the cost of one commit.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..audit import FORCED_KEEP, ForcedRelease
from ..base import Grant
from ..runlog import Claim, RunLog, RunOutcome, RunRecord, Started, StartItem
from .database import Database

if TYPE_CHECKING:
    from . import SQLiteStore

__all__ = ("SQLiteRunLog", "keep_latest")


class SQLiteRunLog(RunLog):
    """Claims and run records in the store's file (see the module docstring)."""

    def __init__(self, store: SQLiteStore, db: Database) -> None:
        self._store = store
        self.db = db
        self.starts = _StartStatements(db.prefix)

    @property
    def leases(self) -> SQLiteStore:
        return self._store

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return self._claim(task, fire_time, claimant)

    def _claim(self, task: str, fire_time: float, claimant: str) -> bool:
        p = self.db.prefix
        rows = self.db.run(
            f"INSERT INTO {p}_claims (task, fire_time, claimant) VALUES (?1, ?2, ?3) "
            "ON CONFLICT (task) DO UPDATE SET fire_time = excluded.fire_time,"
            f" claimant = excluded.claimant WHERE {p}_claims.fire_time < excluded.fire_time"
            f" OR ({p}_claims.fire_time = excluded.fire_time"
            f" AND {p}_claims.claimant = excluded.claimant) RETURNING 1",
            (task, fire_time, claimant),
        )
        return bool(rows)

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        marks = ", ".join("?" * len(occurrences))
        last = dict(
            self.db.run(
                f"SELECT task, fire_time FROM {self.db.prefix}_claims WHERE task IN ({marks})",
                [task for task, _ in occurrences],
            )
        )
        return [task in last and last[task] >= fire for task, fire in occurrences]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        with self.db.transaction():
            return [self._claim(*claim) for claim in claims]

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        # Set-based: four statements for the whole batch (claims, acquires of
        # names with a row, of names without, records), each reading its rows
        # from one JSON array, in one transaction. A statement per item costs
        # more in Python than the store's work: a tick's batch of hundreds
        # held the write lock for tens of milliseconds, and the instances'
        # batches queue behind one another on it.
        if not items:
            return []
        sql = self.starts
        now, wall = time.monotonic_ns(), time.time()
        with self.db.transaction():
            claimed = {
                task
                for (task,) in self.db.run(
                    sql.claim_each, (json.dumps([tuple(item.claim) for item in items]),)
                )
            }
            locks = [
                (lock.name, lock.token, lock.holder, int(lock.ttl * 1e9))
                for claim, lock, _ in items
                if claim.task in claimed
            ]
            fences: dict[str, int] = dict(
                self.db.run(sql.acquire_each, (now, wall, json.dumps(locks)))
            )
            rest = [lock for lock in locks if lock[0] not in fences]
            if rest:
                fences.update(self.db.run(sql.acquire_new_each, (now, wall, json.dumps(rest))))
            records = [
                (*record.row()[:-1], fences[record.task])
                for _, _, record in items
                if record.task in fences
            ]
            if records:
                self.db.run_many(sql.record, records)
                self.db.wrote()
        return [
            Started(
                item.claim.task in claimed,
                None if item.lock.name not in fences else Grant(fences[item.lock.name]),
            )
            for item in items
        ]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        # Two statements for the batch, not two per record: a tick's final
        # records held the write lock (and other instances' starts) for
        # milliseconds of Python per statement.
        if not records:
            return
        ended = sorted({record.task for record in records if record.ended is not None})
        with self.db.transaction():
            self.db.run_many(self.starts.record, [record.row() for record in records])
            if ended:
                self.db.run(self.starts.keep_latest, {"tasks": json.dumps(ended), "keep": keep})
            self.db.wrote()

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        sql = (
            f"UPDATE {self.db.prefix}_runs SET ended = ?, outcome = ?, error = ?"
            " WHERE run_id = ? AND outcome = ?"
        )
        written = 0
        with self.db.transaction():
            cur = self.db.cursor()
            for record in records:
                params = (
                    record.ended,
                    record.outcome,
                    record.error,
                    record.run_id,
                    RunOutcome.RUNNING,
                )
                try:
                    written += cur.execute(sql, params).rowcount
                except sqlite3.Error as exc:
                    raise self.db.failed(exc) from exc
        return written

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        p = self.db.prefix
        columns = "run_id, task, fire_time, instance, started, ended, outcome, error, fence"
        if task is None:
            rows = self.db.run(
                f"SELECT {columns} FROM {p}_runs ORDER BY started DESC LIMIT ?",
                (limit,),
            )
        else:
            rows = self.db.run(
                f"SELECT {columns} FROM {p}_runs WHERE task = ? ORDER BY started DESC LIMIT ?",
                (task, limit),
            )
        return [RunRecord.from_row(row) for row in rows]

    async def record_forced(self, record: ForcedRelease) -> None:
        p = self.db.prefix
        with self.db.transaction():
            self.db.run(
                f"INSERT INTO {p}_forced (record_id, name, at, operator, evicted,"
                " fencing_token, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
                record.row(),
            )
            self.db.run(
                f"DELETE FROM {p}_forced WHERE at < (SELECT at FROM {p}_forced"
                " ORDER BY at DESC LIMIT 1 OFFSET ?)",
                (FORCED_KEEP - 1,),
            )

    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        p = self.db.prefix
        columns = "record_id, name, at, operator, evicted, fencing_token, reason"
        if name is None:
            rows = self.db.run(
                f"SELECT {columns} FROM {p}_forced ORDER BY at DESC LIMIT ?", (limit,)
            )
        else:
            rows = self.db.run(
                f"SELECT {columns} FROM {p}_forced WHERE name = ? ORDER BY at DESC LIMIT ?",
                (name, limit),
            )
        return [ForcedRelease.from_row(row) for row in rows]

    async def board(self, kind: str) -> dict[str, str]:
        p = self.db.prefix
        return dict(self.db.run(f"SELECT key, value FROM {p}_board WHERE kind = ?", (kind,)))

    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        p = self.db.prefix
        if expect is None and value is None:
            rows = self.db.run(f"SELECT 1 FROM {p}_board WHERE kind = ? AND key = ?", (kind, key))
            return not rows
        if expect is None:
            rows = self.db.run(
                f"INSERT INTO {p}_board (kind, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING RETURNING 1",
                (kind, key, value),
            )
        elif value is None:
            rows = self.db.run(
                f"DELETE FROM {p}_board WHERE kind = ? AND key = ? AND value = ? RETURNING 1",
                (kind, key, expect),
            )
        else:
            rows = self.db.run(
                f"UPDATE {p}_board SET value = ? WHERE kind = ? AND key = ? AND value = ?"
                " RETURNING 1",
                (value, kind, key, expect),
            )
        return bool(rows)

    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        if not values:
            return
        p = self.db.prefix
        self.db.run(
            f"INSERT INTO {p}_board (kind, key, value) SELECT ?1, j.key, j.value"
            " FROM json_each(?2) AS j WHERE true"
            " ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value",
            (kind, json.dumps(values)),
        )


class _StartStatements:
    """The statements of a batch: ``start_runs``'s claims and acquires, each
    over a JSON array of rows (``json_each``), with the same rules as one by
    one (``_claim``, ``leases.Statements``); a run record, sent for each of a
    batch's rows (``executemany``), and what each task keeps of its records.
    The tasks of one ``start_runs`` are distinct."""

    def __init__(self, prefix: str) -> None:
        p = prefix
        self.claim_each = (
            f"INSERT INTO {p}_claims (task, fire_time, claimant)"
            " SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2"
            " FROM json_each(?1) AS j WHERE true "
            "ON CONFLICT (task) DO UPDATE SET fire_time = excluded.fire_time,"
            f" claimant = excluded.claimant WHERE {p}_claims.fire_time < excluded.fire_time"
            f" OR ({p}_claims.fire_time = excluded.fire_time"
            f" AND {p}_claims.claimant = excluded.claimant) RETURNING task"
        )
        # ?1 now (monotonic ns), ?2 wall time; rows (name, token, holder, ttl ns).
        self.acquire_each = (
            f"UPDATE {p}_leases SET fence = fence + (token IS NOT b.t OR expires <= ?1),"
            " acquired = CASE WHEN token IS b.t AND expires > ?1 THEN acquired ELSE ?2 END,"
            " token = b.t, holder = b.h, expires = ?1 + b.ttl "
            "FROM (SELECT j.value ->> 0 AS n, j.value ->> 1 AS t, j.value ->> 2 AS h,"
            " j.value ->> 3 AS ttl FROM json_each(?3) AS j) AS b "
            f"WHERE {p}_leases.name = b.n"
            " AND (token IS NULL OR expires <= ?1 OR token = b.t) RETURNING name, fence"
        )
        self.acquire_new_each = (
            f"INSERT INTO {p}_leases (name, token, holder, fence, expires, acquired, waiting) "
            "SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2,"
            f" (SELECT m.value FROM {p}_meta AS m WHERE m.key = 'fence_floor') + 1,"
            " ?1 + (j.value ->> 3), ?2,"
            f" EXISTS (SELECT 1 FROM {p}_waiters AS w WHERE w.name = j.value ->> 0) "
            "FROM json_each(?3) AS j WHERE true ON CONFLICT (name) DO NOTHING RETURNING name, fence"
        )
        # The columns are RunRecord's fields, in order; runs() reads them back the same way.
        self.record = (
            f"INSERT OR REPLACE INTO {p}_runs (run_id, task, fire_time, instance, started,"
            " ended, outcome, error, fence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.keep_latest = keep_latest(p, "json_each(:tasks)")


def keep_latest(prefix: str, tasks: str) -> str:
    """The DELETE of every run of ``tasks`` (a table of task names in a column
    ``value``) but each task's ``:keep`` newest: a run goes when it started
    before the ``:keep``-th newest of its task (so runs that started together
    stay or go together). The bound is read once per task, through the
    (task, started) index."""
    return (
        f"DELETE FROM {prefix}_runs WHERE run_id IN (SELECT r.run_id FROM {tasks} AS t"
        f" JOIN {prefix}_runs AS r ON r.task = t.value WHERE r.started < (SELECT o.started"
        f" FROM {prefix}_runs AS o WHERE o.task = t.value ORDER BY o.started DESC"
        " LIMIT 1 OFFSET :keep - 1))"
    )
