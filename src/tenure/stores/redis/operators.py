"""What operators see and do on Redis: the leases held, one lease, and ``tenure doctor``.

The listing reads leases by SCAN (a pipeline per 500 of them, so ``tenure
locks`` on 10,000 held locks is 20 round trips); one lease is read by its own
key. The configuration check names what can lose a lease: eviction (a held
lock granted again), and a restart without an append-only file fsynced always.
"""

from __future__ import annotations

from typing import Any

from ..base import Finding, LeaseInfo
from .scripts import Keys
from .transport import DRIVER_ERRORS, Transport

__all__ = ("diagnose", "holders", "live_grant")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _escape_glob(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _info(
    name: str, holder: bytes | None, fence: bytes, acquired: bytes | None, pttl: int
) -> LeaseInfo:
    at = float(acquired) if acquired is not None else None
    return LeaseInfo(name, (holder or b"").decode(), int(fence), pttl / 1000, at)


async def holders(transport: Transport, keys: Keys, prefix: str) -> list[LeaseInfo]:
    """The live leases whose names start with ``prefix``, sorted by name."""
    pattern = f"{{{_escape_glob(keys.prefix)}:{_escape_glob(prefix)}*}}:lease"
    client = transport.client
    infos = []
    # One turn for the whole listing: it uses one connection at a time.
    with transport.translated:
        async with transport.gate:
            found = [key async for key in client.scan_iter(match=pattern, count=500)]
            for start in range(0, len(found), 500):
                chunk = found[start : start + 500]
                async with client.pipeline(transaction=False) as pipe:
                    for key in chunk:
                        pipe.hmget(key, "holder", "fence", "acquired")
                        pipe.pttl(key)
                    answers = await pipe.execute()
                for key, (holder, fence, acquired), pttl in zip(
                    chunk, answers[::2], answers[1::2], strict=True
                ):
                    if fence is not None and pttl >= 0:  # else released or expired since
                        infos.append(_info(keys.name_of(key), holder, fence, acquired, pttl))
    return sorted(infos, key=lambda info: info.name)


async def live_grant(transport: Transport, keys: Keys, name: str) -> tuple[str, LeaseInfo] | None:
    """The live grant of ``name`` with its token (for a forced release); None when free."""
    key = keys.lease(name)
    with transport.translated:
        async with transport.gate, transport.client.pipeline(transaction=False) as pipe:
            pipe.hmget(key, "token", "holder", "fence", "acquired")
            pipe.pttl(key)
            (token, holder, fence, acquired), pttl = await pipe.execute()
    if token is None or fence is None or pttl < 0:
        return None
    return token.decode(), _info(name, holder, fence, acquired, pttl)


async def diagnose(client: Any) -> list[Finding]:
    """What the server's configuration means for the guarantees (``tenure doctor``)."""
    found = []
    config: dict[str, str] = {}
    try:
        for name in ("maxmemory-policy", "appendonly", "appendfsync", "save"):
            answer: Any = await client.config_get(name)
            config.update({_text(k): _text(v) for k, v in answer.items()})
    except DRIVER_ERRORS as exc:
        return [
            Finding(
                "warn",
                f"could not read the server's configuration: {exc}",
                "allow CONFIG GET to tenure's user, or check these settings by hand",
            )
        ]
    policy = config.get("maxmemory-policy", "")
    if policy and policy != "noeviction":
        found.append(
            Finding(
                "unsafe",
                f"maxmemory-policy is {policy}: under memory pressure Redis evicts keys, "
                "leases included, and a held lock can be granted again",
                "set maxmemory-policy noeviction (or give tenure a Redis of its own)",
            )
        )
    else:
        found.append(Finding("ok", "maxmemory-policy is noeviction: leases are never evicted"))
    appendonly = config.get("appendonly", "no")
    fsync = config.get("appendfsync", "")
    if appendonly != "yes":
        save = config.get("save", "")
        found.append(
            Finding(
                "warn",
                "no append-only file"
                + (f" (snapshots only: save {save!r})" if save else " and no snapshots")
                + ": a restart forgets the leases, and another client can be granted a "
                "lock whose holder still runs until its next renewal (fencing tokens still "
                "increase)",
                "appendonly yes with appendfsync always keeps every grant across a restart",
            )
        )
    elif fsync != "always":
        found.append(
            Finding(
                "warn",
                f"appendonly yes with appendfsync {fsync}: a crash can lose the last second "
                "of grants",
                "appendfsync always keeps every grant across a crash",
            )
        )
    else:
        found.append(Finding("ok", "appendonly yes, appendfsync always: grants survive a restart"))
    return found
