"""What ``tenure doctor`` checks on MySQL/MariaDB: durability of a commit, and the clock."""

from __future__ import annotations

import time

from ...errors import StoreUnavailable
from ..base import Finding
from .transport import Transport, text

__all__ = ("CLOCK_SKEW_MOST", "diagnose")

CLOCK_SKEW_MOST = 0.5
"""Seconds between the server's clock and this host's past which the doctor warns."""


async def diagnose(transport: Transport) -> list[Finding]:
    try:
        sent = time.time()
        rows = await transport.query(
            "SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog,"
            " TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) / 1e6"
        )
        received = time.time()
    except StoreUnavailable as exc:
        return [Finding("warn", f"could not read the server's settings: {exc}")]
    version, flush, log_bin, sync_binlog, server_now = rows[0]
    found = [Finding("ok", f"server {text(version)}")]
    if int(flush) != 1:
        found.append(
            Finding(
                "unsafe",
                f"innodb_flush_log_at_trx_commit is {flush}: a crash of the server (or, at 2, "
                "of its host) loses the last second of commits, and a lock granted then can "
                "be granted again",
                "set innodb_flush_log_at_trx_commit = 1",
            )
        )
    else:
        found.append(Finding("ok", "innodb_flush_log_at_trx_commit is 1: every grant is durable"))
    if int(log_bin) and int(sync_binlog) != 1:
        found.append(
            Finding(
                "warn",
                f"binary logging with sync_binlog {sync_binlog}: a crash can lose grants from "
                "the binary log, and a replica promoted after it may not have them",
                "set sync_binlog = 1",
            )
        )
    skew = abs(float(server_now) - (sent + received) / 2)
    if skew > CLOCK_SKEW_MOST:
        found.append(
            Finding(
                "warn",
                f"the server's clock is {skew:.2f} s off this host's: expiries are the "
                "server's, so this is harmless for locks, but run records' times mix both",
                "run NTP (chrony) on every host",
            )
        )
    else:
        found.append(Finding("ok", f"the server's clock is within {skew:.3f} s of this host's"))
    return found
