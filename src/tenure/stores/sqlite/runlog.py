"""The SQLite store's run log: claims and run records as rows.

A claim is one row per task (``<prefix>_claims``), advanced by a
compare-and-advance upsert; run records are rows of ``<prefix>_runs``, one
column per ``RunRecord`` field; forced releases' audit records are rows of
``<prefix>_forced``, one column per ``ForcedRelease`` field. A batch (claims,
starts, records) is one write transaction: its items are committed together,
at the cost of one commit.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..audit import FORCED_KEEP, ForcedRelease
from ..runlog import Claim, RunLog, RunOutcome, RunRecord, Started, StartItem
from .database import Database
from .leases import PlainCalls

if TYPE_CHECKING:
    from . import SQLiteStore

__all__ = ("SQLiteRunLog",)


class SQLiteRunLog(RunLog):
    """Claims and run records in the store's file (see the module docstring)."""

    def __init__(self, store: SQLiteStore, db: Database, plain: PlainCalls) -> None:
        self._store = store
        self.db = db
        self.plain = plain

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
        answers: list[Started] = []
        with self.db.transaction():
            for claim, lock, record in items:
                if not self._claim(*claim):
                    answers.append(Started(False, None))
                    continue
                grant = self.plain.acquire(*lock)
                if grant is not None:
                    self._record(dataclasses.replace(record, fence=grant.fencing_token), keep)
                answers.append(Started(True, grant))
        return answers

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        with self.db.transaction():
            for record in records:
                self._record(record, keep)

    def _record(self, record: RunRecord, keep: int) -> None:
        p = self.db.prefix
        self.db.run(
            f"INSERT OR REPLACE INTO {p}_runs (run_id, task, fire_time, instance, started,"
            " ended, outcome, error, fence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            # The columns are RunRecord's fields, in order; runs() reads them back the same way.
            record.row(),
        )
        if record.ended is not None:
            self.db.run(
                f"DELETE FROM {p}_runs WHERE task = ?1 AND started < (SELECT started FROM"
                f" {p}_runs WHERE task = ?1 ORDER BY started DESC LIMIT 1 OFFSET ?2)",
                (record.task, keep - 1),
            )

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
