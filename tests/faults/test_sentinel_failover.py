"""Redis under Sentinel, its master failed over (SIGKILL), judged by the fault checker.

What a failover keeps: every grant the replica had received, and fencing
tokens that keep rising (they never go below the server's ``TIME``, and these
servers share one host's clock). What it loses: a grant the old master had
not passed on. The second test makes that loss certain (the replication link
runs through a fault proxy that swallows it) and shows what follows: the
lock is granted again while its first holder still runs, the fenced resource
refuses the first holder's stale write, and that holder's release reports the
lock lost.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..sentinel_servers import RedisSentinels, client
from .history import read_logs, violations
from .test_faults import Run


def test_a_failover_during_contention(tmp_path: Path) -> None:
    """Four processes contend through the failover: every one finishes its
    grants, tokens rise across it, and the only thing the checker may find is
    an overlap with a grant made before the kill (one the replica had not yet
    received)."""
    servers = RedisSentinels()
    scenario = Run(servers.url, tmp_path)
    try:
        scenario.start(4, iterations=6, hold=0.1)
        scenario.wait_until_holding("w0")
        time.sleep(0.5)
        killed_at = time.monotonic_ns()
        old, new = servers.fail_over()
        failed_over_at = time.monotonic_ns()
        history = scenario.finish()
        assert old != new == servers.replica.port, "the replica became the master"
        assert len(history) == 24, f"every grant was made: {scenario.exit_codes()}"
        assert set(scenario.exit_codes().values()) == {0}, scenario.exit_codes()
        before = [g for g in history if g.granted < killed_at]
        after = [g for g in history if g.requested > failed_over_at]
        assert before and after, "grants on both masters"
        assert max(g.fence for g in before) < min(g.fence for g in after), "tokens rise across it"
        found = violations(history)
        early = {g.fence for g in before}
        assert all("overlap" in v for v in found), found
        for v in found:  # "leases overlap: wA (fence A) until ..., wB (fence B) from ..."
            first = int(v.split("(fence ")[1].split(")")[0])
            assert first in early, f"only a grant from before the kill can be lost: {v}"
        value, accepted, _ = scenario.stats()
        assert value == accepted, "the fenced resource took every write it accepted"
    finally:
        scenario.close()
        servers.stop()


def test_a_grant_the_replica_never_received_is_lost_in_the_failover(tmp_path: Path) -> None:
    servers = RedisSentinels(proxied=True)
    assert servers.link is not None
    scenario = Run(servers.url, tmp_path)
    try:
        servers.link.set_mode("blackhole")  # the master's replication stream goes nowhere
        scenario.start(1, iterations=1, hold=4.0, ttl=5.0)
        scenario.wait_until_holding("w0")
        [events] = read_logs([scenario.log("w0")]).values()
        [held] = [e for e in events if e["op"] == "acquire"]
        time.sleep(0.2)
        assert servers.link.dropped > 0, "the grant's replication was swallowed"
        with client(servers.replica.port) as replica:
            assert replica.dbsize() == 0, "the replica never received the grant"
        killed_at = time.monotonic_ns()
        old, new = servers.fail_over()
        assert new == servers.replica.port != old
        scenario.start(1, iterations=1, hold=0.1, ttl=5.0)
        history = scenario.finish()
        [first] = [g for g in history if g.worker == "w0"]
        [second] = [g for g in history if g.worker == "w1"]
        assert killed_at < second.granted < held["deadline"], (
            "granted again while the first grant's lease would still have run"
        )
        assert second.fence > first.fence, "fencing tokens still rise (the TIME floor)"
        assert first.released is False, "the first holder's release finds the lock lost"
        found = violations(history)
        assert all("overlap" in v for v in found), found
        value, accepted, rejected = scenario.stats()
        assert (value, accepted, rejected) == (1, 1, 1), "the stale write was refused"
    finally:
        scenario.close()
        servers.stop()
