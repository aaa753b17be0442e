"""What the Redis store sends and what comes back: keys, Lua scripts, RESP, reply codes.

Keys of one lock share a hash tag, ``{prefix:name}``: the lease hash
(``...:lease``), its fencing counter (``...:fence``, never expires), the
queued waiter (``...:next``), the hand-over notes (``...:handed``) and the
release channel (``...:released``). A semaphore's keys (its permits, their
expiries, its queue, its limit, its fencing counter, its channel) share
``{prefix:\x1fsem\x1fname}``. Claims share one tag, ``{prefix:claims}``, so
that a batch of them is one script call on a cluster too; each task's run
records (``{prefix:runs:task}``) have a tag of their own.

Each script (``lua/*.lua``, headed by its KEYS, ARGV and return) starts with
the shared functions it names in ``PRELUDES`` (``lua/_*.lua``), so that a rule
is written once.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, cast

from redis.crc import key_slot

from ..runlog import RunRecord

__all__ = (
    "SHAS",
    "SOURCES",
    "Enlisted",
    "Keys",
    "StartReply",
    "evalsha",
    "packed",
    "packed_here",
    "per_slot",
)

_SCRIPTS = (
    "acquire",
    "enlist",
    "release",
    "withdraw",
    "renew",
    "claim",
    "record",
    "abandon",
    "start",
    "releases",
    "records",
    "sem_acquire",
    "sem_release",
    "sem_renew",
    "sem_state",
    "board_swap",
)
PRELUDES = {
    "acquire": ("_grant", "_acquire"),
    "enlist": ("_grant",),
    "release": ("_grant", "_release"),
    "releases": ("_grant", "_release"),
    "claim": ("_claim",),
    "record": ("_record",),
    "records": ("_record",),
    "start": ("_grant", "_acquire", "_claim", "_record"),
    "sem_acquire": ("_sem",),
    "sem_release": ("_sem",),
    "sem_renew": ("_sem",),
    "sem_state": ("_sem",),
}
"""The shared functions (``_*.lua``) each script starts with."""


def _read(name: str) -> str:
    return resources.files("tenure.stores.redis").joinpath(f"lua/{name}.lua").read_text()


SOURCES = {name: "".join(map(_read, (*PRELUDES.get(name, ()), name))) for name in _SCRIPTS}
SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SOURCES.items()}
"""What EVALSHA names each script by: SHA-1 of its source, as the server computes it."""
_SHA_BYTES = {name: sha.encode() for name, sha in SHAS.items()}


_SEMAPHORE = "\x1fsem\x1f"
"""What a semaphore's hash tag puts before its name (no lock name can hold it)."""
_SEMAPHORE_KEYS = (":permits", ":expiries", ":queue", ":lives", ":limit", ":fence")


class Enlisted(enum.IntEnum):
    """The first item of ``enlist.lua``'s reply."""

    GRANTED = 1
    """``{1, fence}``: granted now, for the whole TTL."""
    HANDED_OVER = 2
    """``{2, fence, pttl}``: a release handed it to this waiter; pttl ms are left."""
    QUEUED = 0
    """``{0, pttl}``: held (pttl ms left); this waiter is queued next."""
    BEHIND = -1
    """``{-1, pttl}``: held; another waiter is queued next."""


class StartReply(enum.IntEnum):
    """``start.lua``'s answer per item, when it is not a fencing token (> 0)."""

    CLAIMED_ELSEWHERE = -1
    CLAIMED_LOCK_HELD = 0


Call = tuple[Sequence[str], Sequence[str | int | float]]
"""A script call's keys and arguments."""


class Keys:
    """The key layout of one store (its ``prefix``), and the calls built on it."""

    __slots__ = ("claims_tag", "forced", "prefix", "tasks")

    def board(self, kind: str) -> str:
        """The hash of one kind of the control board (``stores.board``)."""
        return f"{{{self.prefix}:board}}:{kind}"

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tasks = f"{{{prefix}:tasks}}"
        """The set of task names that have run records."""
        self.claims_tag = f"{{{prefix}:claims}}"
        self.forced = f"{{{prefix}:forced}}"
        """The list of forced-release records (JSON rows), newest first."""

    def tag(self, name: str) -> str:
        return f"{{{self.prefix}:{name}}}"

    def semaphore(self, name: str) -> tuple[str, ...]:
        """A semaphore's keys, in the order its scripts take them (see
        ``lua/_sem.lua``): one hash tag, which no lock's can be (lock names
        hold no control character)."""
        tag = self.tag(_SEMAPHORE + name)
        return tuple(tag + part for part in _SEMAPHORE_KEYS)

    def semaphore_channel(self, name: str) -> str:
        return self.tag(_SEMAPHORE + name) + ":freed"

    def lease(self, name: str) -> str:
        return self.tag(name) + ":lease"

    def channel(self, name: str) -> str:
        return self.tag(name) + ":released"

    def fence(self, name: str) -> str:
        return self.tag(name) + ":fence"

    def name_of(self, lease_key: bytes) -> str:
        """The lock name of a lease key that SCAN returned."""
        return lease_key.decode()[len(self.prefix) + 2 : -len("}:lease")]

    def claim(self, task: str) -> str:
        return f"{self.claims_tag}:{task}"

    def runs(self, task: str) -> tuple[str, str]:
        """A task's run records (a hash by run id) and their index (a sorted set by start)."""
        tag = f"{{{self.prefix}:runs:{task}}}"
        return tag + ":records", tag + ":index"

    def acquire(
        self, name: str, token: str, ttl: float, holder: str
    ) -> tuple[tuple[str, str], tuple[str, int, str]]:
        tag = self.tag(name)
        return (tag + ":lease", tag + ":fence"), (token, max(1, round(ttl * 1000)), holder)

    def release(self, name: str, token: str) -> tuple[tuple[str, ...], tuple[str, str]]:
        tag = self.tag(name)
        keys = (tag + ":lease", tag + ":fence", tag + ":next", tag + ":handed")
        return keys, (token, tag + ":released")

    def record(
        self, record: RunRecord, keep: int
    ) -> tuple[tuple[str, str], tuple[str, str, str, int]]:
        # A running record never trims: its run's end record does.
        trim = keep if record.ended is not None else 0
        payload = json.dumps(record.row())
        return self.runs(record.task), (record.run_id, payload, repr(record.started), trim)


Send = Callable[[str, Sequence[str], Sequence[str | int | float]], Awaitable[Any]]
"""A script call: ``Transport.script``."""


async def per_slot(
    send: Send,
    cluster: bool,
    script: str,
    items: Sequence[tuple[str, Sequence[str | int | float]]],
) -> list[Any]:
    """One batch script (one key and its arguments per item, one answer per
    key, as ``renew.lua``) sent as few times as the keys' hash slots allow: a
    script may only touch keys of one slot on Redis Cluster, so one call per
    slot, all sent at once; a single server takes the whole batch in one. The
    answers come back in the items' order."""
    groups: dict[int, list[int]] = {}
    for i, (key, _) in enumerate(items):
        groups.setdefault(key_slot(key.encode()) if cluster else 0, []).append(i)

    async def call(indices: list[int]) -> Any:
        args = [arg for i in indices for arg in items[i][1]]
        return await send(script, [items[i][0] for i in indices], args)

    answers = await asyncio.gather(*(call(indices) for indices in groups.values()))
    results: list[Any] = [None] * len(items)
    for indices, answer in zip(groups.values(), answers, strict=True):
        for i, one in zip(indices, answer, strict=True):
            results[i] = one
    return results


def packed_here(parts: tuple[bytes | str | int | float, ...]) -> bytes:
    """The RESP encoding of a command, as redis-py encodes it: str as UTF-8, a
    float as its repr, an int in decimal."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, bytes):
            raw = part
        elif isinstance(part, str):
            raw = part.encode()
        else:
            raw = (repr(part) if isinstance(part, float) else str(part)).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


_Packer = Callable[[tuple[bytes | str | int | float, ...]], bytes]
try:  # the same bytes, from C: a batch of a thousand items is encoded in a third of the time
    import hiredis

    # Its stub types the argument as a tuple of one item; it takes any number.
    _pack_command = cast(_Packer, hiredis.pack_command)
except ImportError:  # redis-py without its hiredis extra
    _pack_command = packed_here


def packed(*parts: bytes | str | int | float) -> bytes:
    """The RESP encoding of a command (see :func:`packed_here`)."""
    return _pack_command(parts)


def evalsha(name: str, keys: Sequence[str], args: Sequence[str | int | float]) -> bytes:
    """``EVALSHA sha numkeys keys... args...``, encoded."""
    return packed(b"EVALSHA", _SHA_BYTES[name], len(keys), *keys, *args)
