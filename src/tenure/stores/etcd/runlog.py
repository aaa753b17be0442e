"""The etcd store's run log: claims and run records as keys.

A claim is ``P/claim/T`` holding ``<fire time µs>/<claimant>`` (fixed-width
digits, so bytes order is time order), advanced only forward by a nested
transaction; a batch of claims is one transaction. A run record is
``P/run/T\\0S/R`` (a JSON array of ``RunRecord.row()``); keys sort by start
time within a task, so trimming reads the oldest few. A forced release's audit
record is ``P/forced/A/I`` (a JSON array of ``ForcedRelease.row()``; keys sort
by time), trimmed to ``FORCED_KEEP``. The control board's entries are
``P/board/KIND/KEY``; a compare-and-set is a transaction comparing the value
(or, for "no entry", the create revision 0).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from aetcd import rpc

from ..audit import FORCED_KEEP, ForcedRelease, newest
from ..runlog import Claim, RunLog, RunOutcome, RunRecord
from .keys import MAX_TXN_OPS, Keys, delete, is_, micros, prefix_end, read
from .transport import Transport

if TYPE_CHECKING:
    from . import EtcdStore

__all__ = ("EtcdRunLog",)

_TRIM_SEEN = 4
"""Oldest run-record keys read per task when trimming after a batch."""


class EtcdRunLog(RunLog):
    """Claims and run records in etcd (see the module docstring)."""

    def __init__(self, store: EtcdStore, transport: Transport, keys: Keys) -> None:
        self._store = store
        self.transport = transport
        self.keys = keys

    @property
    def leases(self) -> EtcdStore:
        return self._store

    async def claim_occurrence(self, task: str, fire_time: float, claimant: str) -> bool:
        return (await self.claim_occurrences([Claim(task, fire_time, claimant)]))[0]

    async def claimed_already(self, occurrences: Sequence[tuple[str, float]]) -> list[bool]:
        if not occurrences:
            return []
        ops = [read(self.keys.claim(task)) for task, _ in occurrences]
        answer = await self.transport.call("Txn", "kv", rpc.TxnRequest(success=ops))
        # Claimed when the stored "T/claimant" is not less than "T/" (see claim_occurrences).
        return [
            bool(kvs) and kvs[0].value >= micros(fire) + b"/"
            for kvs, (_, fire) in zip(
                (response.response_range.kvs for response in answer.responses),
                occurrences,
                strict=True,
            )
        ]

    async def claim_occurrences(self, claims: Sequence[Claim]) -> list[bool]:
        values = []
        ops = []
        for task, fire_time, claimant in claims:
            key = self.keys.claim(task)
            occurrence = micros(fire_time) + b"/"
            # The claimant tells this claim from an equal one of another
            # instance when it is resent after a lost answer.
            value = occurrence + claimant.encode()
            put = rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))
            values.append(value)
            # Create it if absent, else advance it only forward (fixed-width
            # digits compare as bytes in time order; "T/nonce" is not less
            # than "T/", so an equal occurrence is never claimed twice).
            ops.append(
                rpc.RequestOp(
                    request_txn=rpc.TxnRequest(
                        compare=[is_(key, "CREATE", create_revision=0)],
                        success=[put],
                        failure=[
                            rpc.RequestOp(
                                request_txn=rpc.TxnRequest(
                                    compare=[
                                        rpc.Compare(
                                            key=key,
                                            target=rpc.Compare.VALUE,
                                            result=rpc.Compare.LESS,
                                            value=occurrence,
                                        )
                                    ],
                                    success=[put],
                                    failure=[read(key)],
                                )
                            )
                        ],
                    )
                )
            )
        answer = await self.transport.call("Txn", "kv", rpc.TxnRequest(success=ops))
        claimed = []
        for response, value in zip(answer.responses, values, strict=True):
            outer = response.response_txn
            inner = outer.responses[0].response_txn
            if outer.succeeded or inner.succeeded:
                claimed.append(True)
            else:
                current = inner.responses[0].response_range.kvs
                claimed.append(bool(current) and current[0].value == value)
        return claimed

    async def record_runs(self, records: Sequence[RunRecord], *, keep: int) -> None:
        # RunRecord's fields in order; runs() rebuilds it with RunRecord.from_row(fields).
        puts = [
            rpc.RequestOp(
                request_put=rpc.PutRequest(
                    key=self.keys.run(r.task, r.started, r.run_id),
                    value=json.dumps(r.row()).encode(),
                )
            )
            for r in records
        ]
        await self.transport.call("Txn", "kv", rpc.TxnRequest(success=puts))
        ended = sorted({r.task for r in records if r.ended is not None})
        if not ended:
            return
        # Each ended run adds at most one record to its task, trimmed here
        # every time: the few oldest keys and the count of each task, in one
        # transaction, say what to delete.
        ranges = []
        for task in ended:
            start = self.keys.task_runs(task)
            ranges.append(
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(
                        key=start,
                        range_end=prefix_end(start),
                        keys_only=True,
                        limit=_TRIM_SEEN,
                    )
                )
            )
        answer = await self.transport.call("Txn", "kv", rpc.TxnRequest(success=ranges))
        extra: list[bytes] = []
        for task, response in zip(ended, answer.responses, strict=True):
            found = response.response_range
            over = int(found.count) - keep
            if over > len(found.kvs):  # more than a batch adds (keep was lowered)
                await self._trim(task, keep)
            elif over > 0:
                extra += sorted(kv.key for kv in found.kvs)[:over]
        await self._delete_keys(extra)

    async def _delete_keys(self, keys: Sequence[bytes]) -> None:
        for begin in range(0, len(keys), MAX_TXN_OPS):
            await self.transport.call(
                "Txn",
                "kv",
                rpc.TxnRequest(success=[delete(key) for key in keys[begin : begin + MAX_TXN_OPS]]),
            )

    async def _trim(self, task: str, keep: int) -> int:
        start = self.keys.task_runs(task)
        answer = await self.transport.call(
            "Range",
            "kv",
            rpc.RangeRequest(key=start, range_end=prefix_end(start), keys_only=True),
        )
        keys = sorted(kv.key for kv in answer.kvs)
        extra = keys[: max(0, len(keys) - keep)]
        await self._delete_keys(extra)
        return len(extra)

    async def store_abandoned(self, records: Sequence[RunRecord]) -> int:
        # Rare (the prune task, for dead instances' runs): a read, then a put
        # on the condition that the key did not change since.
        written = 0
        for record in records:
            key = self.keys.run(record.task, record.started, record.run_id)
            found = await self.transport.call("Range", "kv", rpc.RangeRequest(key=key))
            if not found.kvs or json.loads(found.kvs[0].value)[6] != RunOutcome.RUNNING:
                continue
            answer = await self.transport.call(
                "Txn",
                "kv",
                rpc.TxnRequest(
                    compare=[is_(key, "MOD", mod_revision=found.kvs[0].mod_revision)],
                    success=[
                        rpc.RequestOp(
                            request_put=rpc.PutRequest(
                                key=key, value=json.dumps(record.row()).encode()
                            )
                        )
                    ],
                ),
            )
            written += bool(answer.succeeded)
        return written

    async def stored_runs(self, task: str | None = None, limit: int = 50) -> list[RunRecord]:
        start = self.keys.runs if task is None else self.keys.task_runs(task)
        request = rpc.RangeRequest(key=start, range_end=prefix_end(start))
        if task is not None:  # keys sort by start time within one task
            request.sort_order = rpc.RangeRequest.DESCEND
            request.sort_target = rpc.RangeRequest.KEY
            request.limit = limit
        answer = await self.transport.call("Range", "kv", request)
        found = [RunRecord.from_row(json.loads(kv.value)) for kv in answer.kvs]
        found.sort(key=lambda r: r.started, reverse=True)
        return found[:limit]

    async def trim_all(self, keep_runs: int) -> int:
        """Trim every task's records to its ``keep_runs`` newest; how many went."""
        # Leases and their keys expire by themselves in etcd, and fencing tokens
        # are revisions, which never go back: only run records need trimming.
        answer = await self.transport.call(
            "Range",
            "kv",
            rpc.RangeRequest(
                key=self.keys.runs, range_end=prefix_end(self.keys.runs), keys_only=True
            ),
        )
        tasks = {kv.key[len(self.keys.runs) :].split(b"\0", 1)[0].decode() for kv in answer.kvs}
        return sum([await self._trim(task, keep_runs) for task in sorted(tasks)])

    async def record_forced(self, record: ForcedRelease) -> None:
        key = self.keys.forced_release(record.at, record.record_id)
        put = rpc.PutRequest(key=key, value=json.dumps(record.row()).encode())
        await self.transport.call("Put", "kv", put)
        start = self.keys.forced
        every = rpc.RangeRequest(key=start, range_end=prefix_end(start), keys_only=True)
        answer = await self.transport.call("Range", "kv", every)
        over = int(answer.count) - FORCED_KEEP
        if over > 0:
            await self._delete_keys(sorted(kv.key for kv in answer.kvs)[:over])

    async def forced_releases(
        self, name: str | None = None, limit: int = 50
    ) -> list[ForcedRelease]:
        start = self.keys.forced
        answer = await self.transport.call(
            "Range", "kv", rpc.RangeRequest(key=start, range_end=prefix_end(start))
        )
        found = (ForcedRelease.from_row(json.loads(kv.value)) for kv in answer.kvs)
        return newest(found, name, limit)

    async def board(self, kind: str) -> dict[str, str]:
        start = self.keys.board(kind)
        answer = await self.transport.call(
            "Range", "kv", rpc.RangeRequest(key=start, range_end=prefix_end(start))
        )
        return {kv.key[len(start) :].decode(): kv.value.decode() for kv in answer.kvs}

    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        entry = self.keys.board(kind) + key.encode()
        if expect is None:
            held = is_(entry, "CREATE", create_revision=0)
        else:
            held = is_(entry, "VALUE", value=expect.encode())
        if value is None:
            then = [] if expect is None else [delete(entry)]
        else:
            then = [rpc.RequestOp(request_put=rpc.PutRequest(key=entry, value=value.encode()))]
        answer = await self.transport.call(
            "Txn", "kv", rpc.TxnRequest(compare=[held], success=then)
        )
        return bool(answer.succeeded)

    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        if not values:
            return
        start = self.keys.board(kind)
        puts = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=start + key.encode(), value=v.encode()))
            for key, v in values.items()
        ]
        await self.transport.call("Txn", "kv", rpc.TxnRequest(success=puts))
