"""The PostgreSQL store's run log: claims and run records as rows.

A claim is one row per task (``<prefix>_claims``), advanced by a
compare-and-advance upsert; run records are rows of ``<prefix>_runs`` (one
column per ``RunRecord`` field), forced releases' audit records rows of
``<prefix>_forced`` (one column per ``ForcedRelease`` field), the control
board's entries rows of ``<prefix>_board`` (kind, key, value). A batch of
occurrence starts is one statement and one transaction: the claims, then the
acquires of those won, then the start records of those granted, each step
reading the one before through its RETURNING; rows are written in task order,
so two batches that share tasks lock them in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..audit import FORCED_KEEP, ForcedRelease
from ..base import Grant
from ..runlog import Claim, RunLog, RunOutcome, RunRecord, Started, StartItem
from .schema import Names
from .sql import ACQUIRE_OR_NOT
from .transport import Transport

if TYPE_CHECKING:
    from . import PostgresStore

__all__ = ("PostgresRunLog",)


class _Statements:
    """The run log's statements of one (schema, prefix), rendered once."""

    def __init__(self, names: Names) -> None:
        claim_or_not = (
            "ON CONFLICT (task) DO UPDATE SET fire_time = excluded.fire_time,"
            " claimant = excluded.claimant WHERE c.fire_time < excluded.fire_time"
            " OR (c.fire_time = excluded.fire_time AND c.claimant = excluded.claimant) "
        )
        self.claim = names.render(
            "INSERT INTO {claims} AS c (task, fire_time, claimant) VALUES (%s, %s, %s) "
            + claim_or_not
            + "RETURNING 1"
        )
        self.claimed = names.render("SELECT task, fire_time FROM {claims} WHERE task = ANY(%s)")
        record_or_replace = (
            "ON CONFLICT (run_id) DO UPDATE SET fire_time = excluded.fire_time,"
            " instance = excluded.instance, started = excluded.started, ended = excluded.ended,"
            " outcome = excluded.outcome, error = excluded.error, fence = excluded.fence"
        )
        # A batch of occurrence starts in one statement, one transaction (one
        # commit, not one per occurrence): the claims; for each claim won, the
        # acquire; for each grant, the start record. Each step reads the one
        # before through its RETURNING (data-modifying CTEs see no other effect
        # of the same statement; the tables differ). Rows are written in task
        # order, so two batches that share tasks lock them in the same order.
        self.start = names.render(
            "WITH i AS (SELECT * FROM unnest(%(task)s::text[], %(fire)s::float8[],"
            " %(claimant)s::text[], %(token)s::text[], %(holder)s::text[], %(ttl)s::float8[],"
            " %(run_id)s::text[], %(run_fire)s::float8[], %(instance)s::text[],"
            " %(started)s::float8[], %(outcome)s::text[]) WITH ORDINALITY"
            " AS i(task, fire, claimant, token, holder, ttl, run_id, run_fire, instance, started,"
            " outcome, n)), "
            "c AS (INSERT INTO {claims} AS c (task, fire_time, claimant)"
            " SELECT task, fire, claimant FROM i ORDER BY task "
            + claim_or_not
            + "RETURNING c.task), "
            "g AS (INSERT INTO {leases} AS l (name, token, holder, fence, expires, acquired)"
            " SELECT i.task, i.token, i.holder, nextval({fence_literal}),"
            " clock_timestamp() + make_interval(secs => i.ttl), clock_timestamp()"
            " FROM i JOIN c USING (task) ORDER BY i.task "
            + ACQUIRE_OR_NOT
            + "RETURNING l.name, l.fence), "
            "r AS (INSERT INTO {runs} (run_id, task, fire_time, instance, started, ended,"
            " outcome, error, fence) SELECT i.run_id, i.task, i.run_fire, i.instance, i.started,"
            " NULL, i.outcome, NULL, g.fence FROM i JOIN g ON g.name = i.task "
            + record_or_replace
            + ") "
            "SELECT c.task IS NOT NULL, g.fence FROM i LEFT JOIN c USING (task)"
            " LEFT JOIN g ON g.name = i.task ORDER BY i.n"
        )
        # A batch of run records in one statement; then the tasks of the ended
        # ones trimmed in one more (a statement does not see its own inserts).
        self.records = names.render(
            "INSERT INTO {runs} (run_id, task, fire_time, instance, started, ended, outcome,"
            " error, fence) SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[],"
            " %s::text[], %s::float8[], %s::float8[], %s::text[], %s::text[], %s::int8[]) "
            + record_or_replace
        )
        self.trim_each = names.render(
            "DELETE FROM {runs} r USING unnest(%(tasks)s::text[]) AS t(task)"
            " WHERE r.task = t.task AND r.started < (SELECT x.started FROM {runs} x"
            " WHERE x.task = t.task ORDER BY x.started DESC LIMIT 1 OFFSET %(skip)s)"
        )
        self.abandon = names.render(
            "UPDATE {runs} SET ended = %s, outcome = %s, error = %s"
            f" WHERE run_id = %s AND outcome = '{RunOutcome.RUNNING}' RETURNING 1"
        )
        columns = "run_id, task, fire_time, instance, started, ended, outcome, error, fence"
        self.runs_all = names.render(
            f"SELECT {columns} FROM {{runs}} ORDER BY started DESC LIMIT %s"
        )
        self.runs_task = names.render(
            f"SELECT {columns} FROM {{runs}} WHERE task = %s ORDER BY started DESC LIMIT %s"
        )
        forced = "record_id, name, at, operator, evicted, fencing_token, reason"
        # The insert and the trim to the newest FORCED_KEEP, in one statement.
        # The DELETE does not see the row the INSERT adds (one snapshot): it
        # keeps FORCED_KEEP - 1 of the others.
        self.record_forced = names.render(
            f"WITH new AS (INSERT INTO {{forced}} ({forced}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " RETURNING 1) DELETE FROM {forced} WHERE at < (SELECT at FROM {forced}"
            f" ORDER BY at DESC LIMIT 1 OFFSET {FORCED_KEEP - 2})"
        )
        self.board = names.render("SELECT key, value FROM {board} WHERE kind = %s")
        self.board_create = names.render(
            "INSERT INTO {board} (kind, key, value) VALUES (%s, %s, %s)"
            " ON CONFLICT DO NOTHING RETURNING 1"
        )
        self.board_update = names.render(
            "UPDATE {board} SET value = %s WHERE kind = %s AND key = %s AND value = %s RETURNING 1"
        )
        self.board_delete = names.render(
            "DELETE FROM {board} WHERE kind = %s AND key = %s AND value = %s RETURNING 1"
        )
        self.board_absent = names.render(
            "SELECT NOT EXISTS (SELECT 1 FROM {board} WHERE kind = %s AND key = %s)"
        )
        self.board_put = names.render(
            "INSERT INTO {board} (kind, key, value) SELECT %s, * FROM unnest(%s::text[],"
            " %s::text[]) ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value"
        )
        self.forced_all = names.render(f"SELECT {forced} FROM {{forced}} ORDER BY at DESC LIMIT %s")
        self.forced_name = names.render(
            f"SELECT {forced} FROM {{forced}} WHERE name = %s ORDER BY at DESC LIMIT %s"
        )


class PostgresRunLog(RunLog):
    """Claims and run records in PostgreSQL (see the module docstring)."""

    def __init__(self, store: PostgresStore, transport: Transport, names: Names) -> None:
        self._store = store
        self.transport = transport
        self.sql = _Statements(names)

    @property
    def leases(self) -> PostgresStore:
        return self._store

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return bool(await self.transport.query(self.sql.claim, (task, fire_time, claimant)))

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        rows = await self.transport.query(self.sql.claimed, ([task for task, _ in occurrences],))
        last = dict(rows)
        return [task in last and last[task] >= fire for task, fire in occurrences]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        return [bool(rows) for rows in await self.transport.query_each(self.sql.claim, claims)]

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        if not items:
            return []
        # One array per column (a lock's name and a record's task are its claim's task).
        rows = await self.transport.query(
            self.sql.start,
            {
                "task": [claim.task for claim, _, _ in items],
                "fire": [claim.fire_time for claim, _, _ in items],
                "claimant": [claim.claimant for claim, _, _ in items],
                "token": [lock.token for _, lock, _ in items],
                "holder": [lock.holder for _, lock, _ in items],
                "ttl": [lock.ttl for _, lock, _ in items],
                "run_id": [record.run_id for _, _, record in items],
                "run_fire": [record.fire_time for _, _, record in items],
                "instance": [record.instance for _, _, record in items],
                "started": [record.started for _, _, record in items],
                "outcome": [str(record.outcome) for _, _, record in items],
            },
        )
        return [
            Started(claimed, None if fence is None else Grant(fence)) for claimed, fence in rows
        ]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        if not records:
            return
        # One array per column, in RunRecord's field order.
        await self.transport.query(
            self.sql.records,
            [list(column) for column in zip(*map(RunRecord.row, records), strict=True)],
        )
        ended = sorted({r.task for r in records if r.ended is not None})
        if ended:
            await self.transport.query(self.sql.trim_each, {"tasks": ended, "skip": keep - 1})

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        answers = await self.transport.query_each(
            self.sql.abandon, [(r.ended, r.outcome, r.error, r.run_id) for r in records]
        )
        return sum(len(rows) for rows in answers)

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        if task is None:
            rows = await self.transport.query(self.sql.runs_all, (limit,))
        else:
            rows = await self.transport.query(self.sql.runs_task, (task, limit))
        return [RunRecord.from_row(row) for row in rows]

    async def record_forced(self, record: ForcedRelease) -> None:
        await self.transport.query(self.sql.record_forced, record.row())

    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        if name is None:
            rows = await self.transport.query(self.sql.forced_all, (limit,))
        else:
            rows = await self.transport.query(self.sql.forced_name, (name, limit))
        return [ForcedRelease.from_row(row) for row in rows]

    async def board(self, kind: str) -> dict[str, str]:
        return dict(await self.transport.query(self.sql.board, (kind,)))

    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        if expect is None and value is None:
            [(absent,)] = await self.transport.query(self.sql.board_absent, (kind, key))
            return bool(absent)
        if expect is None:
            rows = await self.transport.query(self.sql.board_create, (kind, key, value))
        elif value is None:
            rows = await self.transport.query(self.sql.board_delete, (kind, key, expect))
        else:
            rows = await self.transport.query(self.sql.board_update, (value, kind, key, expect))
        return bool(rows)

    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        if values:
            await self.transport.query(
                self.sql.board_put, (kind, list(values), list(values.values()))
            )
