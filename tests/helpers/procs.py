"""Starting and talking to worker processes from tests."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

HELPERS = Path(__file__).parent
ROOT = HELPERS.parent.parent

T = TypeVar("T")


class Worker:
    """A ``holder.py`` process: send a command, read its JSON answer."""

    def __init__(self, url: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPERS / "holder.py"), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = self.proc.pid
        ready = self.read(timeout=30)
        assert ready.get("ready"), ready

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 20) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"worker {self.pid} said nothing for {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError(f"worker {self.pid} exited with {self.proc.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, line: str, timeout: float = 20) -> dict[str, Any]:
        self.send(line)
        return self.read(timeout)

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
                self.send("exit")
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def processes_naming(text: str) -> list[str]:
    """Command lines of the running processes that mention ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # not a process, or it ended meanwhile
            continue
        if text in line:
            found.append(line)
    return found


def until_it_answers(server: subprocess.Popen[str], ask: Callable[[], T], what: str) -> T:
    """``ask()``'s first answer that is not an OSError (the server is up),
    within 30 s, while ``server`` runs."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return ask()
        except OSError:
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, f"{what} did not answer in 30 s"
            time.sleep(0.2)
