"""What the etcd store writes: its keys, and the transaction pieces built on them.

Keys (``P`` is the prefix, ``N`` the lock name)::

    P/lock/N     the holder's display id (JSON); its create revision is the fencing token
    P/token/N    sha256 of the grant's secret token: what release and renewal compare
    P/claim/T    the last claimed occurrence of task T (fixed-width µs, so bytes order = time order)
    P/run/T\\0S/R one run record of task T, started at S (fixed-width µs), run id R
    P/sem/N\\x1fD  a permit or queued waiter of semaphore N (D: its token's sha256),
                 on an etcd lease; its create revision orders the queue and fences
    P/semlimit/N the limit of semaphore N
"""

from __future__ import annotations

import hashlib
from typing import Any

from aetcd import rpc

__all__ = (
    "MAX_TXN_OPS",
    "Keys",
    "delete",
    "digest",
    "is_",
    "micros",
    "prefix_end",
    "read",
)

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


def micros(seconds: float) -> bytes:
    return b"%020d" % round(seconds * 1e6)


def delete(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


def read(key: bytes) -> Any:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def is_(key: bytes, target: str, **compared: Any) -> Any:
    """A transaction's condition: ``target`` (CREATE, VALUE, LEASE, MOD) of ``key`` equals."""
    return rpc.Compare(
        key=key,
        target=getattr(rpc.Compare, target),
        result=rpc.Compare.EQUAL,
        **compared,
    )


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).hexdigest().encode()


class Keys:
    """The key layout of one store (its ``prefix``)."""

    __slots__ = ("boards", "claims", "forced", "limits", "locks", "runs", "sems", "tokens")

    def __init__(self, prefix: str) -> None:
        p = prefix.encode()
        self.locks = p + b"/lock/"
        self.tokens = p + b"/token/"
        self.claims = p + b"/claim/"
        self.runs = p + b"/run/"
        self.forced = p + b"/forced/"
        self.sems = p + b"/sem/"
        self.limits = p + b"/semlimit/"
        self.boards = p + b"/board/"

    def board(self, kind: str) -> bytes:
        """What every entry of one kind of the control board starts with."""
        return self.boards + kind.encode() + b"/"

    def permits(self, name: str) -> bytes:
        """What every permit and queue entry of semaphore ``name`` starts with
        (a control character ends the name: no other name's can start so)."""
        return self.sems + name.encode() + b"\x1f"

    def permit(self, name: str, token: str) -> bytes:
        return self.permits(name) + digest(token)

    def limit(self, name: str) -> bytes:
        return self.limits + name.encode()

    def lock(self, name: str) -> bytes:
        return self.locks + name.encode()

    def token(self, name: str) -> bytes:
        return self.tokens + name.encode()

    def claim(self, task: str) -> bytes:
        return self.claims + task.encode()

    def task_runs(self, task: str) -> bytes:
        return self.runs + task.encode() + b"\0"

    def run(self, task: str, started: float, run_id: str) -> bytes:
        return self.task_runs(task) + micros(started) + b"/" + run_id.encode()

    def forced_release(self, at: float, record_id: str) -> bytes:
        return self.forced + micros(at) + b"/" + record_id.encode()
