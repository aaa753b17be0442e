"""The README and the documentation site: every code block runs as written.

A Python block runs in a fresh interpreter and must exit 0; a shell block
runs under bash (``set -euo pipefail``) with this environment's ``tenure`` on
PATH, unless the line above it says ``<!-- no-run: why -->``. The store URL
placeholder (``docs/index.md``, "About the examples") becomes a fresh file.
The site itself builds with ``mkdocs build --strict`` in ``scripts/test.sh``
(and in ``test_the_site_builds_strictly`` here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from .helpers.procs import ROOT

PLACEHOLDER = "sqlite:///tmp/myapp-tenure.db"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
NO_RUN = re.compile(r"<!-- no-run: (.+?) -->\n$")
RUN_BY = re.compile(r"<!-- run-by: (tests/\S+\.py) .+? -->\n$")
"""A block that a test of its own runs as a server's application (FastAPI under
uvicorn, a Django project): that test reads it from the page."""


class Block(NamedTuple):
    page: str
    line: int
    language: str
    code: str
    no_run: str | None
    run_by: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()]
            marker = NO_RUN.search(before)
            run_by = RUN_BY.search(before)
            found.append(
                Block(
                    str(page.relative_to(ROOT)),
                    before.count("\n") + 1,
                    match[1],
                    match[2],
                    marker[1] if marker else None,
                    run_by[1] if run_by else None,
                )
            )
    return found


BLOCKS = _blocks()
PYTHON = [b for b in BLOCKS if b.language == "python"]
SHELL = [b for b in BLOCKS if b.language in ("sh", "bash", "shell", "console")]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env.pop("TENURE_URL", None)
    return env


def _run(
    block: Block, tmp_path: Path, *command: str, prefix: str = ""
) -> subprocess.CompletedProcess[str]:
    """``command`` with the block's code (its store URL a file in ``tmp_path``)
    as its last argument, in ``tmp_path``; it must exit 0."""
    code = prefix + block.code.replace(PLACEHOLDER, f"sqlite://{tmp_path}/example.db")
    done = subprocess.run(
        [*command, code],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"{block}:\n{done.stdout}\n{done.stderr}"
    return done


def test_every_block_is_known_and_every_page_has_code() -> None:
    languages = {b.language for b in BLOCKS}
    # Code in any other language would go untested: name it here once it runs.
    assert languages <= {"python", "sh", "text", ""}, languages
    assert len(PYTHON) >= 10 and len(SHELL) >= 5, [str(b) for b in BLOCKS]
    for block in BLOCKS:
        if block.language in ("text", ""):
            assert not re.search(r"^\s*(import |from \w+ import |\$ )", block.code, re.M), (
                f"{block}: code in a block without a language is never run; mark it python or sh"
            )


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    assert block.no_run is None, f"{block}: every Python block runs"
    if block.run_by is not None:
        runner = (ROOT / block.run_by).read_text()
        assert block.page.removeprefix("docs/") in runner, f"{block.run_by} reads {block.page}"
        return  # that test runs it, served as its framework serves it
    done = _run(block, tmp_path, sys.executable, "-c")
    assert done.stdout.strip(), f"{block} printed nothing: an example shows what it did"


@pytest.mark.parametrize("block", SHELL, ids=str)
def test_shell_block_runs_or_says_why_not(block: Block, tmp_path: Path) -> None:
    if block.no_run is not None:
        assert len(block.no_run) >= 10, f"{block}: say why it does not run"
        pytest.skip(f"{block}: {block.no_run}")
    _run(block, tmp_path, "bash", "-c", prefix="set -euo pipefail\n")


def test_the_readme_is_a_landing_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    # The package's long description: no link that breaks off the repository.
    assert not re.search(r"\]\((?!https?://)", readme), "relative link in README.md"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env=dict(_env(), NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reference = (tmp_path / "reference" / "index.html").read_text()
    for name in ("tenure.LockService", "tenure.Scheduler", "tenure.sync.LockService"):
        assert f'id="{name}"' in reference, f"{name} missing from the API reference"
