"""Redis managed by Sentinel: ``redis+sentinel://`` URLs, the master's client, replication checks.

URL: ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
with the store's options and these: ``socket_timeout`` (as on a single
server; each sentinel is given a share of it, so that asking all of them
fits in it), ``sentinel_username`` and ``sentinel_password`` (when the
sentinels ask for credentials of their own; the URL's user and password are
the master's).

The client is redis-py's Sentinel-managed one: each new connection asks the
sentinels for the master first, and a connection to a master that was
demoted (it answers ``READONLY``) is dropped as broken, so the store's one
retry goes to the new master. A failover is asynchronous replication
switching sides: a grant the old master had not yet passed on is lost with
it, and fencing tokens keep rising across it only because they never go
below the server's ``TIME`` (so only while the hosts' clocks agree within the
failover's duration). ``diagnose`` checks both.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis.asyncio.sentinel
import redis.sentinel

from ...errors import ConfigurationError
from .._options import mask, number
from ..base import Finding

__all__ = (
    "NO_MASTER",
    "SCHEME",
    "Target",
    "aclose_sentinels",
    "close_sentinels",
    "diagnose_replication",
    "is_sentinel",
    "master_client",
    "said",
)

SCHEME = "redis+sentinel"

CLOCK_SKEW_MOST = 0.1
"""Seconds between the master's and a replica's clock past which ``tenure doctor`` warns."""

_PASSED_ON = ("socket_timeout", "socket_connect_timeout")
"""Query options given to every connection, the sentinels' included."""


NO_MASTER = (redis.sentinel.MasterNotFoundError, redis.asyncio.sentinel.MasterNotFoundError)
"""No sentinel named a master: every sentinel was asked, twice (the new
connection's own retry), so asking once more would only double the wait."""


def said(exc: BaseException) -> str:
    """The driver's words for ``exc``; for a master no sentinel named, what
    each sentinel answered, without redis-py's description of each sentinel's
    client (a screenful apiece)."""
    text = str(exc)
    if not isinstance(exc, NO_MASTER):
        return text
    head, _, rest = text.partition(" : ")
    answers = re.findall(r"> - (.*?)(?=, <redis\.|$)", rest)
    return f"{head}; the sentinels: {'; '.join(answers)}" if answers else head


def is_sentinel(url: str) -> bool:
    return url.partition(":")[0].lower() == SCHEME


@dataclass(frozen=True)
class Target:
    """What a ``redis+sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    sentinel_username: str | None
    sentinel_password: str | None
    options: tuple[tuple[str, float], ...]


def parse(url: str) -> Target:
    """The sentinels, service and credentials of ``url``; ConfigurationError
    naming what is wrong."""
    where = mask(url)
    rest = url.partition("://")[2]
    base, _, query = rest.partition("?")
    userinfo, at, hosts_and_path = base.rpartition("@")
    if not at:
        hosts_and_path = base
    hosts, _, path = hosts_and_path.partition("/")
    sentinels = tuple(_host(part, where) for part in hosts.split(",") if part)
    if not sentinels:
        raise ConfigurationError(f"no sentinel host:port in {where!r}")
    service, _, db_text = path.partition("/")
    service = unquote(service)
    if not service:
        raise ConfigurationError(
            f"no service name in {where!r}: redis+sentinel://host:26379/SERVICE, "
            "the name the sentinels monitor (sentinel monitor SERVICE ...)"
        )
    db = 0
    if db_text:
        if not db_text.isdigit():
            raise ConfigurationError(f"database {db_text!r} in {where!r} is not a number")
        db = int(db_text)
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinel_username = sentinel_password = None
    options: list[tuple[str, float]] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "sentinel_username":
            sentinel_username = value
        elif key == "sentinel_password":
            sentinel_password = value
        elif key in _PASSED_ON:
            seconds = float(number("Redis Sentinel", key, value, float))
            if not 0 < seconds <= 3600:
                raise ConfigurationError(f"{key} must be between 0 and 3600 seconds, got {value!r}")
            options.append((key, seconds))
        else:
            known = ", ".join(sorted(("sentinel_username", "sentinel_password", *_PASSED_ON)))
            raise ConfigurationError(
                f"unknown Redis Sentinel URL option {key!r}; known: {known} "
                "(and the store's: prefix, pool_max)"
            )
    return Target(
        sentinels,
        service,
        db,
        username,
        password,
        sentinel_username,
        sentinel_password,
        tuple(options),
    )


def _host(part: str, where: str) -> tuple[str, int]:
    host, colon, port = part.rpartition(":")
    if not colon:
        host, port = part, "26379"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"bad sentinel address {part!r} in {where!r}: expected host:port")
    return host, int(port)


def master_client(sentinel_class: type[Any], url: str, **kwargs: Any) -> Any:
    """A client of the master that ``url``'s sentinels name (``sentinel_class``:
    redis-py's asyncio or blocking ``Sentinel``), made with ``kwargs`` as
    ``from_url`` would be; the URL's timeouts win over them."""
    target = parse(url)
    kwargs.update(target.options)
    # Asking for the master tries the sentinels one after another, and a new
    # connection may ask twice (redis-py's connect retry): each sentinel gets
    # a share of the call's timeout, so that sentinels that do not answer fail
    # a call within it rather than a multiple of it.
    share = 2 * len(target.sentinels)
    sentinel_kwargs: dict[str, Any] = {
        k: max(float(v) / share, 0.05) for k, v in kwargs.items() if k.startswith("socket_")
    }
    if target.sentinel_username is not None:
        sentinel_kwargs["username"] = target.sentinel_username
    if target.sentinel_password is not None:
        sentinel_kwargs["password"] = target.sentinel_password
    sentinel = sentinel_class(list(target.sentinels), sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(
        target.service,
        db=target.db,
        username=target.username,
        password=target.password,
        **kwargs,
    )


async def aclose_sentinels(client: Any) -> None:
    """Close the connections to the sentinels behind ``client`` (asyncio), if any:
    closing the master's client leaves them open."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    if manager is not None:
        await manager.aclose()


def close_sentinels(client: Any) -> None:
    """The same for a blocking client."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    if manager is not None:
        manager.close()


async def diagnose_replication(client: Any) -> list[Finding]:
    """What a failover can cost: grants not yet replicated (``min-replicas-to-write``)
    and fencing tokens, which rise across it only while the clocks agree."""
    found: list[Finding] = []
    pool = client.connection_pool
    sentinels: Any = pool.sentinel_manager
    try:
        answer: Any = await client.config_get("min-replicas-to-write")
        replicas = await sentinels.discover_replicas(pool.service_name)
    except Exception as exc:  # (any driver error: the finding says it)
        return [
            Finding(
                "warn",
                f"could not read the replication settings: {exc}",
                "allow CONFIG GET and SENTINEL REPLICAS to tenure's users, or check by hand",
            )
        ]
    least = int(next(iter(answer.values()), b"0") or 0)
    if least < 1:
        found.append(
            Finding(
                "warn",
                "min-replicas-to-write is 0: a failover loses every grant the old master had "
                "not yet passed on, and that lock can be granted again while its holder runs",
                "set min-replicas-to-write 1 (and min-replicas-max-lag) on the master and "
                "replicas: a master cut off from its replicas then refuses grants instead",
            )
        )
    else:
        found.append(
            Finding(
                "ok",
                f"min-replicas-to-write is {least}: a master without a replica refuses grants "
                "(replication is still asynchronous: the last grant before a failover can be lost)",
            )
        )
    found.extend(await _clocks(client, replicas))
    return found


async def _clocks(client: Any, replicas: Sequence[tuple[str, int]]) -> list[Finding]:
    """The replicas' clocks against the master's (fencing tokens carry ``TIME``)."""
    if not replicas:
        return [
            Finding(
                "warn",
                "the sentinels know no replica of this master: a failover has nowhere to go",
                "add a replica (replicaof) and let the sentinels discover it",
            )
        ]
    master = await _offset(client)
    findings = []
    kwargs = client.connection_pool.connection_kwargs
    for host, port in replicas:
        replica = type(client)(
            host=host,
            port=port,
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            socket_timeout=kwargs.get("socket_timeout"),
        )
        try:
            skew = abs(await _offset(replica) - master)
        except Exception as exc:  # (any driver error: the finding says it)
            findings.append(
                Finding("warn", f"could not read the clock of replica {host}:{port}: {exc}")
            )
            continue
        finally:
            with contextlib.suppress(Exception):
                await replica.aclose()
        if skew > CLOCK_SKEW_MOST:
            findings.append(
                Finding(
                    "warn",
                    f"replica {host}:{port}'s clock is {skew:.3f} s off the master's: fencing "
                    "tokens never go below the server's TIME, so after a failover to it they "
                    "can repeat or go back by that much",
                    "run NTP (chrony) on every Redis host",
                )
            )
        else:
            findings.append(
                Finding(
                    "ok", f"replica {host}:{port}'s clock is within {skew:.3f} s of the master's"
                )
            )
    return findings


async def _offset(client: Any) -> float:
    """How far the server's ``TIME`` is ahead of this host's clock (seconds),
    read at the middle of the round trip."""
    sent = time.time()
    seconds, micros = await client.time()
    received = time.time()
    return int(seconds) + int(micros) / 1e6 - (sent + received) / 2
