"""The MySQL/MariaDB store's run log: claims, run records and audit records as rows.

A claim is one row per task, advanced by a compare-and-advance upsert; a
batch of claims is one transaction (the upsert of every row, read from a
JSON array with ``JSON_TABLE``, then a read of which are now the caller's).
Run records are rows of ``<prefix>_runs``, one column per ``RunRecord``
field; forced releases' audit records are JSON in ``<prefix>_forced``; the
control board's entries rows of ``<prefix>_board``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..audit import FORCED_KEEP, ForcedRelease
from ..runlog import Claim, RunLog, RunOutcome, RunRecord
from .schema import Names
from .transport import Transport, decoded, text

if TYPE_CHECKING:
    from . import MySQLStore

__all__ = ("MySQLRunLog",)

_CLAIMS = (
    "JSON_TABLE(%s, '$[*]' COLUMNS (i INT PATH '$[0]',"
    " t VARCHAR(320) CHARACTER SET utf8mb4 PATH '$[1]', f DOUBLE PATH '$[2]',"
    " c VARCHAR(1024) CHARACTER SET utf8mb4 PATH '$[3]')) AS j"
)

CLAIM_WINS = "fire_time < {fire} OR (fire_time = {fire} AND claimant = {claimant})"
"""The compare of a claim's compare-and-advance (see ``RunLog.claim_occurrence``)."""

_RUN_COLUMNS = "run_id, task, fire_time, instance, started, ended, outcome, error, fence"


class MySQLRunLog(RunLog):
    """Claims and run records in MySQL/MariaDB (see the module docstring)."""

    def __init__(self, store: MySQLStore, transport: Transport, names: Names) -> None:
        self._store = store
        self.transport = transport
        self.names = names
        # The assignments run left to right: the claimant's test reads the
        # old fire_time, and the fire_time's reads the claimant just set,
        # which equals the new one exactly when the claim was granted. The
        # new values are the SELECT's columns (VALUES() is deprecated in MySQL 8).
        claim = CLAIM_WINS.format(fire="j.f", claimant="CAST(j.c AS BINARY)")
        advance = (
            f"claimant = IF({claim}, CAST(j.c AS BINARY), claimant),"
            f" fire_time = IF({claim}, j.f, fire_time)"
        )
        self._claim_each = (
            f"INSERT INTO {names.claims} (task, fire_time, claimant)"
            f" SELECT CAST(j.t AS BINARY), j.f, CAST(j.c AS BINARY) FROM {_CLAIMS}"
            f" ON DUPLICATE KEY UPDATE {advance}"
        )
        self._claimed_each = (
            f"SELECT j.i FROM {_CLAIMS} JOIN {names.claims} AS c"
            " ON c.task = CAST(j.t AS BINARY)"
            " WHERE c.fire_time = j.f AND c.claimant = CAST(j.c AS BINARY)"
        )
        self._record = (
            f"REPLACE INTO {names.runs} ({_RUN_COLUMNS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        # Everything older than the newest ``keep`` of a task (a derived
        # table: MySQL takes no LIMIT in a subquery of the table it deletes from).
        self._trim = (
            f"DELETE FROM {names.runs} WHERE task = %s AND started < (SELECT started FROM"
            f" (SELECT started FROM {names.runs} WHERE task = %s ORDER BY started DESC"
            " LIMIT 1 OFFSET %s) AS newest)"
        )
        self._abandon = (
            f"UPDATE {names.runs} SET ended = %s, outcome = %s, error = %s"
            f" WHERE run_id = %s AND outcome = '{RunOutcome.RUNNING}'"
        )

    @property
    def leases(self) -> MySQLStore:
        return self._store

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        [claimed] = await self.claim_occurrences([Claim(task, fire_time, claimant)])
        return claimed

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        if not claims:
            return []
        rows = json.dumps([[i, *claim] for i, claim in enumerate(claims)])

        async def work(cur: Any) -> set[int]:
            await cur.execute(self._claim_each, (rows,))
            await cur.execute(self._claimed_each, (rows,))
            return {int(i) for (i,) in await cur.fetchall()}

        mine = await self.transport.in_transaction(work)
        return [i in mine for i in range(len(claims))]

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        marks = ", ".join(["%s"] * len(occurrences))
        rows = await self.transport.query(
            f"SELECT task, fire_time FROM {self.names.claims} WHERE task IN ({marks})",
            [task for task, _ in occurrences],
        )
        last = {text(task): fire for task, fire in rows}
        return [task in last and last[task] >= fire for task, fire in occurrences]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        if not records:
            return
        ended = sorted({r.task for r in records if r.ended is not None})

        async def work(cur: Any) -> None:
            await cur.executemany(self._record, [record.row() for record in records])
            for task in ended:
                await cur.execute(self._trim, (task, task, keep - 1))

        await self.transport.in_transaction(work)

    async def trim_all(self, keep: int) -> int:
        """Every task's run records beyond the newest ``keep``; how many went."""

        async def work(cur: Any) -> int:
            await cur.execute(f"SELECT DISTINCT task FROM {self.names.runs}")
            gone = 0
            for (task,) in await cur.fetchall():
                name = text(task)  # (aiomysql cannot send bytes as a parameter)
                await cur.execute(self._trim, (name, name, keep - 1))
                gone += int(cur.rowcount)
            return gone

        return await self.transport.in_transaction(work)

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        if not records:
            return 0

        async def work(cur: Any) -> int:
            stored = 0
            for r in records:
                await cur.execute(self._abandon, (r.ended, str(r.outcome), r.error, r.run_id))
                stored += int(cur.rowcount)
            return stored

        return await self.transport.in_transaction(work)

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        if task is None:
            rows = await self.transport.query(
                f"SELECT {_RUN_COLUMNS} FROM {self.names.runs} ORDER BY started DESC LIMIT %s",
                (limit,),
            )
        else:
            rows = await self.transport.query(
                f"SELECT {_RUN_COLUMNS} FROM {self.names.runs} WHERE task = %s"
                " ORDER BY started DESC LIMIT %s",
                (task, limit),
            )
        return [RunRecord.from_row([decoded(value) for value in row]) for row in rows]

    async def record_forced(self, record: ForcedRelease) -> None:
        forced = self.names.forced

        async def work(cur: Any) -> None:
            await cur.execute(
                f"INSERT INTO {forced} (record, name, at) VALUES (%s, %s, %s)",
                (json.dumps(record.row()), record.name, record.at),
            )
            await cur.execute(
                f"DELETE FROM {forced} WHERE at < (SELECT at FROM (SELECT at FROM {forced}"
                f" ORDER BY at DESC LIMIT 1 OFFSET {FORCED_KEEP - 1}) AS newest)"
            )

        await self.transport.in_transaction(work)

    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        forced = self.names.forced
        if name is None:
            rows = await self.transport.query(
                f"SELECT record FROM {forced} ORDER BY at DESC, id DESC LIMIT %s", (limit,)
            )
        else:
            rows = await self.transport.query(
                f"SELECT record FROM {forced} WHERE name = %s ORDER BY at DESC, id DESC LIMIT %s",
                (name, limit),
            )
        return [ForcedRelease.from_row(json.loads(text(record))) for (record,) in rows]

    async def board(self, kind: str) -> dict[str, str]:
        rows = await self.transport.query(
            f"SELECT k, value FROM {self.names.board} WHERE kind = %s", (kind,)
        )
        return {text(key): text(value) for key, value in rows}

    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        board = self.names.board
        if (expect is None and value is None) or expect == value:
            rows = await self.transport.query(
                f"SELECT value FROM {board} WHERE kind = %s AND k = %s", (kind, key)
            )
            return [text(v) for (v,) in rows] == ([] if expect is None else [expect])
        if expect is None:
            # Not INSERT IGNORE: its duplicate is a warning, which aiomysql
            # raises as one. Inserted, the row counts 1; kept as it was, 0.
            sql = (
                f"INSERT INTO {board} (kind, k, value) VALUES (%s, %s, %s)"
                " ON DUPLICATE KEY UPDATE k = k"
            )
            args: tuple[object, ...] = (kind, key, value)
        elif value is None:
            sql = f"DELETE FROM {board} WHERE kind = %s AND k = %s AND value = %s"
            args = (kind, key, expect)
        else:
            # The values differ: an UPDATE that matched its row changed it
            # (MySQL counts the rows changed, not the rows matched).
            sql = f"UPDATE {board} SET value = %s WHERE kind = %s AND k = %s AND value = %s"
            args = (value, kind, key, expect)
        return await self.transport.changed(sql, args) == 1

    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        if values:
            await self.transport.changed(
                f"INSERT INTO {self.names.board} (kind, k, value)"
                " SELECT %s, CAST(j.k AS BINARY), CAST(j.v AS BINARY) FROM JSON_TABLE(%s, '$[*]'"
                " COLUMNS (k VARCHAR(320) CHARACTER SET utf8mb4 PATH '$[0]',"
                " v LONGTEXT CHARACTER SET utf8mb4 PATH '$[1]')) AS j"
                " ON DUPLICATE KEY UPDATE value = CAST(j.v AS BINARY)",
                (kind, json.dumps(list(values.items()))),
            )
