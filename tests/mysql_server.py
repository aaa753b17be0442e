"""A throwaway MariaDB server (Debian's ``mariadb-server``) in a temporary directory.

``mariadb-install-db`` makes the data directory, ``mariadbd`` serves it on a
free loopback port (and a socket in the directory, through which the
fixture, as root without a password, creates the tests' database and user).
Durability is off unless ``durable=True`` (``innodb_flush_log_at_trx_commit=1``
and ``sync_binlog``, production's settings, for benchmarks).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pymysql

from .servers import OneProcess, free_port

DATABASE = "tenure"
USER = "tenure"
PASSWORD = "tenure-test"


class MariaDBServer(OneProcess):
    """See the module docstring."""

    def __init__(self, *, durable: bool = False) -> None:
        for binary in ("mariadbd", "mariadb-install-db"):
            if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists():
                raise RuntimeError(f"{binary} is not installed: apt-get install -y mariadb-server")
        self.durable = durable
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-mariadb-"))
        self.data = self.dir / "data"
        self.socket = self.dir / "sock"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    f"--datadir={self.data}",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--user=root",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            self.start()
            with self.root() as conn, conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE {DATABASE}")
                cur.execute(f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'")
                cur.execute(f"GRANT ALL ON {DATABASE}.* TO '{USER}'@'127.0.0.1'")
        except BaseException:
            self.stop()
            raise

    def url(self, scheme: str = "mysql") -> str:
        return f"{scheme}://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def root(self) -> pymysql.connections.Connection[Any]:
        """A connection as root over the socket (to close after use)."""
        return pymysql.connect(unix_socket=str(self.socket), user="root", autocommit=True)

    def sql(self, script: str) -> str:
        """Run ``script`` (``DELIMITER`` lines too) with the ``mariadb`` client as
        root; its output."""
        done = subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-N", DATABASE],
            input=script,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return done.stdout

    def start(self) -> None:
        flush = "1" if self.durable else "2"
        self.proc = subprocess.Popen(
            [
                shutil.which("mariadbd") or "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.data}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.socket}",
                f"--pid-file={self.dir / 'pid'}",
                "--user=root",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                f"--innodb-flush-log-at-trx-commit={flush}",
                "--max-connections=300",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # A raw probe: PyMySQL leaks the socket of a connect that fails.
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as probe:
                    if probe.recv(1) and self.socket.exists():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        code = self.proc.poll()
        self._kill()
        raise RuntimeError(f"mariadbd on port {self.port} did not start (exit status {code})")

    def restart(self) -> None:
        """SIGKILL and start again on the same data (InnoDB recovers)."""
        self._kill()
        self.start()
