"""The package as a user gets it: built, checked, installed into a fresh
virtual environment outside the repository, and used from there."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import tenure

from .helpers.procs import ROOT

ACQUIRE = """
import asyncio, sys
import tenure
from tenure import LockService

async def main() -> None:
    async with LockService.from_url(sys.argv[1]) as locks:
        lock = await locks.acquire("packaging", ttl=10)
        assert lock is not None
        async with lock:
            print(tenure.__file__, lock.fencing_token)

asyncio.run(main())
"""


def _run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # The wheel is built from the sdist (what build does given neither flag),
    # so a file the sdist lacks fails here too.
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT, cwd=tmp_path)
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    assert wheel.name == f"tenure-{tenure.__version__}-py3-none-any.whl"
    _run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path)

    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"tenure-{tenure.__version__}.dist-info/METADATA").decode()
    assert "tenure/py.typed" in names
    assert {"tenure/stores/redis/lua/acquire.lua", "tenure/stores/redis/lua/release.lua"} <= names
    assert f"tenure-{tenure.__version__}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT" in metadata
    assert "Project-URL: Documentation, " in metadata
    assert "Provides-Extra: test" not in metadata, "test tools are a dependency group"
    assert "](docs/" not in metadata and "](tests/" not in metadata, "no relative links"
    with tarfile.open(sdist) as tar:
        members = {
            Path(m).relative_to(f"tenure-{tenure.__version__}").as_posix()
            for m in tar.getnames()[1:]
        }
    assert "LICENSE" in members and "src/tenure/__init__.py" in members
    assert not any(m.startswith(("tests/", "bench/")) for m in members), "left out on purpose"

    env = tmp_path / "env"
    venv.create(env, with_pip=True)
    _run(env / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path)
    version = _run(env / "bin" / "tenure", "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"tenure {tenure.__version__}"
    demo = _run(env / "bin" / "tenure", "demo", "--instances", "2", "--seconds", "3", cwd=tmp_path)
    assert "duplicates: 0  missing: 0" in demo.stdout
    acquired = _run(
        env / "bin" / "python", "-c", ACQUIRE, f"sqlite://{tmp_path}/app.db", cwd=tmp_path
    )
    where, token = acquired.stdout.split()
    assert where.startswith(str(env)), "the installed package, not the repository's"
    assert int(token) >= 1


def test_the_set_up_scripts_refuse_a_python_too_old_and_make_no_venv(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    for script in ("demo.sh", "venv.sh"):
        (tmp_path / "scripts" / script).write_text((ROOT / "scripts" / script).read_text())
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    old = tmp_path / "python3.9"
    # An interpreter that answers as Python 3.9 does: the version check fails.
    old.write_text(
        '#!/bin/sh\nif [ "$1" = -V ]; then echo "Python 3.9.2"; exit 0; fi\n'
        'if [ "$1" = -c ]; then exit 1; fi\nexit 3\n'
    )
    old.chmod(0o755)
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "demo.sh")],
        env={**os.environ, "PYTHON": str(old)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "tenure needs Python 3.11 or newer" in done.stderr
    assert "Python 3.9.2" in done.stderr and "PYTHON=" in done.stderr
    assert not (tmp_path / ".venv").exists()
