"""Throwaway servers for the tests, started from the Debian binaries on free loopback ports."""

from __future__ import annotations

import contextlib
import json
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


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped.

    A signal to a process is taken by one of its threads, which then stops
    the others: on a busy host the rest may answer for a while after
    ``kill`` returned (a paused MariaDB was seen answering an acquire sent
    after it). Nothing a test sends after this returns is answered."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [
                (Path(f"/proc/{pid}/task") / task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                for task in os.listdir(f"/proc/{pid}/task")
            ]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return  # it exited, or a thread did meanwhile: look no further
        if all(state in ("T", "t", "Z", "X") for state in states):
            return
        time.sleep(0.001)
    raise RuntimeError(f"process {pid} did not stop within {timeout} s of SIGSTOP")


class OneProcess:
    """A server that is one process with a directory of its own."""

    dir: Path
    proc: subprocess.Popen[bytes] | None

    def start(self) -> None:
        raise NotImplementedError

    def pause(self) -> None:
        assert self.proc is not None
        sigstop(self.proc.pid)

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


class RedisServer(OneProcess):
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


def _postgres_binary(name: str) -> str:
    """A PostgreSQL server binary: on PATH, or in Debian's versioned directory (newest)."""
    found = shutil.which(name)
    if found is not None:
        return found
    candidates = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
    )
    if not candidates:
        raise RuntimeError(f"{name} is not installed: apt-get install -y postgresql")
    return str(candidates[-1])


class _DiedBySignal(RuntimeError):
    """A server process killed by a signal before it answered."""


class PostgresServer:
    """A throwaway PostgreSQL cluster: ``initdb`` and ``postgres`` in a temporary directory.

    Run as the ``postgres`` user when the tests run as root (PostgreSQL refuses
    root), on a free loopback port, in a process group of its own so that
    ``pause`` stops the postmaster and every backend at once. ``fsync`` is off
    (only an OS crash could lose data; a killed server loses nothing) unless
    ``fsync=True`` (production's setting, for benchmarks).
    ``password``: the superuser ``postgres`` gets it and TCP logins need it (scram).
    """

    def __init__(self, *, password: str | None = None, fsync: bool = False) -> None:
        self.fsync = fsync
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            shutil.chown(self.dir, "postgres", "postgres")
        try:
            args = [
                _postgres_binary("initdb"),
                *("-D", str(self.data), "-U", "postgres", "--no-sync", "-E", "UTF8"),
                *("--locale", "C", "--auth-local", "trust"),
            ]
            if password is not None:
                pwfile = self.dir / "pw"
                pwfile.write_text(password + "\n")
                if self._user is not None:
                    shutil.chown(pwfile, self._user)
                args += ["--auth-host", "scram-sha-256", "--pwfile", str(pwfile)]
            else:
                args += ["--auth-host", "trust"]
            subprocess.run(args, check=True, capture_output=True, user=self._user, timeout=120)
            self.start()
        except BaseException:
            self.stop()
            raise

    def url(self, *, user: str = "postgres", password: str | None = None) -> str:
        auth = f"{user}:{password}@" if password is not None else f"{user}@"
        return f"postgresql://{auth}127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        try:
            self._start()
        except _DiedBySignal:
            # Seen once in CI: the forked child segfaulted at start-up (exit status
            # -11) while the test process had gRPC threads live (an etcd client):
            # fork() beside threads, not PostgreSQL. Once more is enough.
            self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [
                _postgres_binary("postgres"),
                *("-D", str(self.data), "-p", str(self.port), "-k", str(self.dir)),
                *(
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"fsync={'on' if self.fsync else 'off'}",
                ),
                *("-c", "max_connections=200", "-c", "shared_buffers=32MB"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self._user,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run(
                [
                    _postgres_binary("pg_isready"),
                    *("-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"),
                ],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        code = self.proc.poll()
        self._kill()
        failed = _DiedBySignal if code is not None and code < 0 else RuntimeError
        raise failed(f"postgres on port {self.port} did not start (exit status {code})")

    def psql(self, sql: str) -> str:
        """Run SQL as the superuser over the unix socket; returns psql's output."""
        return subprocess.run(
            [
                _postgres_binary("psql"),
                *("-h", str(self.dir), "-p", str(self.port), "-U", "postgres", "-d", "postgres"),
                *("-v", "ON_ERROR_STOP=1", "-Atc", sql),
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout

    def _signal_all(self, sig: signal.Signals) -> None:
        """Signal the postmaster, then every process it forked.

        Each backend makes itself a process group of its own (setsid), so a
        signal to the postmaster's group would miss the connections already open.
        """
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        for child in _children(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    def pause(self) -> None:
        """SIGSTOP the server and every backend: open connections stop answering too."""
        assert self.proc is not None
        for pid in (self.proc.pid, *_children(self.proc.pid)):
            sigstop(pid)

    def resume(self) -> None:
        assert self.proc is not None
        for child in _children(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            children = _children(self.proc.pid)
            self._signal_all(signal.SIGKILL)
            self.proc.wait()
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGCONT)
                    os.kill(child, signal.SIGKILL)
        self.proc = None

    def restart(self) -> None:
        """SIGKILL every server process and start again on the same data and port."""
        self._kill()
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        self.start()

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


class PgBouncer:
    """A pgbouncer in transaction pooling mode in front of a PostgresServer."""

    def __init__(self, server: PostgresServer) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed: apt-get install -y pgbouncer")
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-pgbouncer-"))
        self.port = free_port()
        user = "postgres" if os.geteuid() == 0 else None
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"postgres = host=127.0.0.1 port={server.port} dbname=postgres user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\n"
            f"unix_socket_dir =\nauth_type = any\npool_mode = transaction\n"
            "default_pool_size = 2\nmax_client_conn = 100\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\npidfile =\n"
        )
        if user is not None:
            shutil.chown(self.dir, user)
            shutil.chown(ini, user)
        self.proc = subprocess.Popen(
            [binary, str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=user,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer on port {self.port} did not start")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class EtcdCluster:
    """A three-member etcd cluster (Debian's ``etcd``), each member on its own pair
    of loopback ports and temporary data directory.

    Short heartbeat and election timeouts so that a lost leader is replaced in well
    under a second and the minimum lease TTL (1.5x the election timeout) is below
    one second; clients may send keepalive pings every 500 ms.
    """

    def __init__(
        self, *extra: str, members: int = 3, tls: Path | None = None, fsync: bool = False
    ) -> None:
        """``tls``: a directory with cert.pem and key.pem; clients then speak only TLS.
        ``fsync``: without ``--unsafe-no-fsync`` (production's setting, for benchmarks)."""
        self.fsync = fsync
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: apt-get install -y etcd-server")
        self.binary = binary
        self.extra = extra
        self.NAMES = tuple(f"m{i}" for i in range(members))
        self.tls = tls
        self.auth: tuple[str, str] | None = None
        self.dir = Path(tempfile.mkdtemp(prefix="tenure-etcd-"))
        self.client_ports = {name: free_port() for name in self.NAMES}
        self.peer_ports = {name: free_port() for name in self.NAMES}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started_once = False
        try:
            self.start()
        except BaseException:
            self.stop()
            raise

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{self.client_ports[n]}" for n in self.NAMES)

    @property
    def url(self) -> str:
        return f"etcd://{self.endpoints}"

    def start_member(self, name: str) -> None:
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer_ports[n]}" for n in self.NAMES)
        scheme = "https" if self.tls is not None else "http"
        client = f"{scheme}://127.0.0.1:{self.client_ports[name]}"
        peer = f"http://127.0.0.1:{self.peer_ports[name]}"
        certs = []
        if self.tls is not None:
            certs = [
                *("--cert-file", str(self.tls / "cert.pem")),
                *("--key-file", str(self.tls / "key.pem")),
            ]
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - the member keeps it
        self.procs[name] = subprocess.Popen(
            [
                self.binary,
                *("--name", name, "--data-dir", str(self.dir / name)),
                *("--listen-client-urls", client, "--advertise-client-urls", client),
                *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
                *("--initial-cluster", cluster, "--initial-cluster-token", self.dir.name),
                *("--initial-cluster-state", "existing" if self.started_once else "new"),
                *("--heartbeat-interval", "25", "--election-timeout", "250"),
                "--grpc-keepalive-min-time",
                "500ms",
                *(() if self.fsync else ("--unsafe-no-fsync",)),
                *("--logger", "zap", "--log-level", "warn"),
                *certs,
                *self.extra,
            ],
            stdout=log,
            stderr=log,
        )
        log.close()

    def start(self) -> None:
        """Start every member that is not running and wait until the cluster has a leader."""
        for name in self.NAMES:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                self.start_member(name)
        self.started_once = True
        self.wait_healthy()

    def etcdctl(self, *args: str, endpoints: str | None = None) -> str:
        options = ["--endpoints", endpoints or self.endpoints, "--command-timeout=2s"]
        if self.tls is not None:
            options.append(f"--cacert={self.tls / 'cert.pem'}")
        if self.auth is not None:
            options.append(f"--user={self.auth[0]}:{self.auth[1]}")
        out = subprocess.run(
            ["etcdctl", *options, *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
            env=dict(os.environ, ETCDCTL_API="3"),
        )
        return out.stdout

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.etcdctl("put", "tenure-test-health", "ok")
                return
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the etcd cluster in {self.dir} has no leader") from exc
                time.sleep(0.05)

    def leader(self) -> str:
        """The member that is leader now."""
        for name in self.NAMES:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            endpoint = f"127.0.0.1:{self.client_ports[name]}"
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                status = self.etcdctl("endpoint", "status", "-w", "json", endpoints=endpoint)
                [entry] = json.loads(status)
                if entry["Status"]["leader"] == entry["Status"]["header"]["member_id"]:
                    return name
        raise RuntimeError("no etcd member says it is the leader")

    def enable_auth(self, password: str) -> None:
        """A root user with ``password``, and authentication on."""
        self.etcdctl("user", "add", f"root:{password}")
        self.etcdctl("auth", "enable")
        self.auth = ("root", password)

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill_member(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()

    def pause(self) -> None:
        for name in self.NAMES:
            sigstop(self.procs[name].pid)

    def resume(self) -> None:
        for name in self.NAMES:
            self.signal(name, signal.SIGCONT)

    def _kill(self) -> None:
        for name in list(self.procs):
            self.kill_member(name)

    def restart(self) -> None:
        """Kill every member and start them again on their data: nothing is lost."""
        self._kill()
        self.start()

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)
