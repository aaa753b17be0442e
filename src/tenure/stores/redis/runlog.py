"""The Redis store's run log: occurrence claims and run records.

* A claim is a string ``'<fire time>\\n<claimant>'`` per task, all under one
  hash tag (``{prefix:claims}``), so a batch of claims is one script call and
  a batch of reads one MGET, on a cluster too.
* A task's records are a hash by run id (JSON arrays of ``RunRecord.row()``)
  and a sorted set by start time, under the task's own tag; the set
  ``{prefix:tasks}`` names the tasks that have records.
* On a single server, an occurrence's start (claim, lock, record) is one
  script call for the whole batch (``start.lua``), and so are a batch of
  records and of releases; on a cluster, whose keys of one item are in
  different hash slots, the contract's default three steps are made.
* Forced releases' audit records are a list (``{prefix:forced}``) of JSON
  arrays of ``ForcedRelease.row()``, newest first, trimmed to ``FORCED_KEEP``.
* Each kind of the control board is a hash (``{prefix:board}:KIND``); a
  compare-and-set is a script (``board_swap.lua``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..audit import FORCED_KEEP, ForcedRelease, newest
from ..base import Grant
from ..runlog import Claim, RunLog, RunRecord, Started, StartItem
from .scripts import Keys, StartReply
from .transport import Transport

if TYPE_CHECKING:
    from . import RedisStore

__all__ = ("RedisRunLog",)


class RedisRunLog(RunLog):
    """Claims and run records in Redis (see the module docstring)."""

    def __init__(self, store: RedisStore, transport: Transport, keys: Keys) -> None:
        self._store = store
        self.transport = transport
        self.keys = keys

    @property
    def leases(self) -> RedisStore:
        return self._store

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return (await self.claim_occurrences([Claim(task, fire_time, claimant)]))[0]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        if not claims:
            return []
        keys = [self.keys.claim(claim.task) for claim in claims]
        args: list[str | int | float] = []
        for claim in claims:
            args += [repr(float(claim.fire_time)), claim.claimant]
        answers = await self.transport.script("claim", keys, args)
        return [bool(answer) for answer in answers]

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        keys = [self.keys.claim(task) for task, _ in occurrences]
        values: list[bytes | None] = await self.transport.call("mget", keys)
        answers = []
        for value, (_, fire) in zip(values, occurrences, strict=True):
            # A key of an older shape answers False, and the claim itself then
            # says what is wrong.
            last, sep, _claimant = (value or b"").partition(b"\n")
            answers.append(bool(sep) and float(last) >= fire)
        return answers

    async def start_runs(self, items: Sequence[StartItem], *, keep: int) -> list[Started]:
        if self.transport.cluster or not items:
            return await super().start_runs(items, keep=keep)
        keys = [self.keys.tasks]
        args: list[str | int | float] = []
        for claim, lock, record in items:
            lease_keys, lease_args = self.keys.acquire(*lock)
            keys += [self.keys.claim(claim.task), *lease_keys, *self.keys.runs(record.task)]
            args += [repr(float(claim.fire_time)), claim.claimant, *lease_args]
            # Its fence last, null: start.lua writes the grant's in its place.
            row = json.dumps((*record.row()[:-1], None))
            args += [record.run_id, row, repr(record.started), record.task]
        answers = await self.transport.script("start", keys, args)
        return [
            Started(
                answer != StartReply.CLAIMED_ELSEWHERE, Grant(int(answer)) if answer > 0 else None
            )
            for answer in answers
        ]

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        if not records:
            return
        if self.transport.cluster:
            # Each task's records are in a hash slot of their own: a script each.
            calls = [("record", *self.keys.record(r, keep)) for r in records]
            await self.transport.scripts(calls)
            await self.transport.call("sadd", self.keys.tasks, *sorted({r.task for r in records}))
            return
        keys = [self.keys.tasks]
        args: list[str | int | float] = []
        for record in records:
            record_keys, record_args = self.keys.record(record, keep)
            keys += record_keys
            args += [*record_args, record.task]
        await self.transport.script("records", keys, args)

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        calls = [
            ("abandon", (self.keys.runs(r.task)[0],), (r.run_id, json.dumps(r.row())))
            for r in records
        ]
        return sum(int(answer) for answer in await self.transport.scripts(calls))

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        tasks = await self.task_names() if task is None else [task]
        found: list[RunRecord] = []
        for name in tasks:
            records, index = self.keys.runs(name)
            ids: Any = await self.transport.call("zrevrange", index, 0, limit - 1)
            if ids:
                for raw in await self.transport.call("hmget", records, list(ids)):
                    if raw is not None:
                        found.append(RunRecord.from_row(json.loads(raw)))
        found.sort(key=lambda r: r.started, reverse=True)
        return found[:limit]

    async def task_names(self) -> list[str]:
        names: Any = await self.transport.call("smembers", self.keys.tasks)
        return [name.decode() for name in names]

    async def trim(self, task: str, keep: int) -> int:
        """Remove the records of ``task`` beyond its ``keep`` newest; how many went."""
        records, index = self.keys.runs(task)
        return int(await self.transport.script("record", (records, index), ("", "", "0", keep)))

    async def record_forced(self, record: ForcedRelease) -> None:
        await self.transport.call("lpush", self.keys.forced, json.dumps(record.row()))
        await self.transport.call("ltrim", self.keys.forced, 0, FORCED_KEEP - 1)

    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        rows: Any = await self.transport.call("lrange", self.keys.forced, 0, -1)
        return newest((ForcedRelease.from_row(json.loads(row)) for row in rows), name, limit)

    async def board(self, kind: str) -> dict[str, str]:
        entries: Any = await self.transport.call("hgetall", self.keys.board(kind))
        return {_text(key): _text(value) for key, value in entries.items()}

    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        args = [key, "0" if expect is None else "1", expect or "", "0" if value is None else "1"]
        answer = await self.transport.script(
            "board_swap", [self.keys.board(kind)], [*args, value or ""]
        )
        return bool(answer)

    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        if values:
            await self.transport.call("hset", self.keys.board(kind), None, None, dict(values))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
