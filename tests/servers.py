"""Throwaway servers for the tests, started from the Debian binaries on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; ``with_bus``: port + 10000 free too (a cluster node's bus)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if not with_bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisServer:
    """A redis-server in a temporary directory, without persistence unless asked."""

    def __init__(self, *extra: str, tls: Path | None = None, cluster: bool = False) -> None:
        """``tls``: a directory with cert.pem and key.pem; the server then speaks only TLS."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: apt-get install -y redis-server")
        self.binary = binary
        self.extra = extra
        self.tls = tls
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-redis-"))
        self.port = free_port(with_bus=cluster)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls / 'cert.pem'}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        ports = ["--port", str(self.port)]
        if self.tls is not None:
            ports = [
                *("--port", "0", "--tls-port", str(self.port)),
                *("--tls-cert-file", str(self.tls / "cert.pem")),
                *("--tls-key-file", str(self.tls / "key.pem")),
                *("--tls-ca-cert-file", str(self.tls / "cert.pem"), "--tls-auth-clients", "no"),
            ]
        self.proc = subprocess.Popen(
            [
                self.binary,
                *ports,
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                *("--save", "", "--appendonly", "no", "--daemonize", "no"),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    if self.tls is not None:
                        return  # listening; the TLS handshake is the test's business
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64):  # PONG, or NOAUTH when the default user is off
                        return
            except OSError:
                if self.proc.poll() is not None:
                    break  # it exited: no point waiting
                time.sleep(0.02)
        code = self.proc.poll()
        self._kill()
        raise RuntimeError(f"redis-server on port {self.port} did not start (exit status {code})")

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """Kill the server and remove its directory."""
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        """Kill and start again on the same port and directory (no persistence: empty)."""
        self._kill()
        self.start()


def self_signed_cert(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem) made with openssl."""
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(directory / "key.pem"),
            "-out",
            str(directory / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return directory


class RedisClusterServers:
    """Three cluster-enabled redis-servers made into one cluster of three masters."""

    def __init__(self) -> None:
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(3):
                self.nodes.append(
                    RedisServer(
                        *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                        *("--cluster-node-timeout", "2000"),
                        cluster=True,
                    )
                )
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
            deadline = time.monotonic() + 20
            while not all(self._ok(node) for node in self.nodes):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        out = subprocess.run(
            ["redis-cli", "-p", str(node.port), "cluster", "info"],
            capture_output=True,
            text=True,
            check=False,
            timeout=5,
        ).stdout
        return "cluster_state:ok" in out

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=true"

    def pause(self) -> None:
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        for node in self.nodes:
            node.resume()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
