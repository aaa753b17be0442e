"""A throwaway Redis Sentinel deployment: a master, a replica and three sentinels.

Started from Debian's ``redis-server`` and ``redis-sentinel`` on free loopback
ports, each in a temporary directory. The sentinels judge a master down after
``DOWN_AFTER_MS`` and fail over with a quorum of two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from .faults.proxy import Proxy
from .servers import RedisServer, free_port

SERVICE = "tenuremaster"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 2000


def client(port: int, password: str | None = None) -> redis.Redis:
    """A plain redis-py client of a server or sentinel on ``port`` (to close after use)."""
    return redis.Redis(port=port, password=password, socket_timeout=1, socket_connect_timeout=1)


class RedisSentinels:
    """A Sentinel-managed master and replica (see the module docstring)."""

    def __init__(
        self,
        *,
        proxied: bool = False,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        """``proxied``: the replica replicates through a fault proxy (``link``),
        so that a test can hold back what the master passes on; ``password``:
        the master's and replica's (``requirepass``); ``sentinel_password``:
        the sentinels' own."""
        self.password = password
        self.sentinel_password = sentinel_password
        auth = ("--requirepass", password, "--masterauth", password) if password else ()
        binary = shutil.which("redis-sentinel")
        if binary is None:
            raise RuntimeError("redis-sentinel is not installed: apt-get install -y redis-sentinel")
        self.binary = binary
        self.master = RedisServer(
            *("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"), *auth
        )
        self.link = Proxy(self.master.port) if proxied else None
        upstream = self.master.port if self.link is None else self.link.port
        self.replica = RedisServer(
            *("--replicaof", "127.0.0.1", str(upstream)),
            *("--repl-diskless-load", "on-empty-db"),
            *auth,
        )
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-sentinel-"))
        self.ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            self._wait_replicated()
            for i, port in enumerate(self.ports):
                self.procs.append(self._start_sentinel(i, port))
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        auth = f":{self.password}@" if self.password else ""
        query = f"?sentinel_password={self.sentinel_password}" if self.sentinel_password else ""
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}{query}"

    def _wait_replicated(self) -> None:
        deadline = time.monotonic() + 20
        with client(self.replica.port, self.password) as replica:
            while replica.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis replica did not connect to its master")
                time.sleep(0.05)

    def _start_sentinel(self, i: int, port: int) -> subprocess.Popen[bytes]:
        conf = self.dir / f"sentinel-{i}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
            + (f"sentinel auth-pass {SERVICE} {self.password}\n" if self.password else "")
            + (f"requirepass {self.sentinel_password}\n" if self.sentinel_password else "")
        )
        return subprocess.Popen(
            [self.binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers names it."""
        for port in self.ports:
            with (
                client(port, self.sentinel_password) as sentinel,
                contextlib.suppress(redis.RedisError),
            ):
                address = sentinel.sentinel_get_master_addr_by_name(SERVICE)
                if address:
                    return int(address[1])
        raise RuntimeError("no sentinel names a master")

    def wait_ready(self, timeout: float = 30) -> None:
        """Until every sentinel knows the master, its replica and the other two."""
        deadline = time.monotonic() + timeout
        while True:
            ready = 0
            for port in self.ports:
                with (
                    client(port, self.sentinel_password) as sentinel,
                    contextlib.suppress(redis.RedisError),
                ):
                    state = sentinel.sentinel_master(SERVICE)
                    if (
                        state["num-slaves"] == 1
                        and state["num-other-sentinels"] == 2
                        and not state["is_sdown"]
                    ):
                        ready += 1
            if ready == len(self.ports):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not all see the master, replica and peers")
            time.sleep(0.1)

    def fail_over(self, timeout: float = 20) -> tuple[int, int]:
        """SIGKILL the master and wait until the sentinels name the replica
        instead: (the old master's port, the new one's)."""
        old = self.master_port()
        server = self.master if self.master.port == old else self.replica
        server.pause()  # (SIGSTOP first: nothing it answers after this instant counts)
        server._kill()
        deadline = time.monotonic() + timeout
        while (new := self.master_port()) == old:
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not fail the master over")
            time.sleep(0.05)
        return old, new

    def pause(self) -> None:
        """SIGSTOP everything, the sentinels too (so that they fail nothing over)."""
        for server in (self.master, self.replica):
            if server.proc is not None:
                server.pause()
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGCONT)
        for server in (self.master, self.replica):
            if server.proc is not None:
                server.resume()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
        self.master.stop()
        self.replica.stop()
        if self.link is not None:
            self.link.close()
        shutil.rmtree(self.dir, ignore_errors=True)
