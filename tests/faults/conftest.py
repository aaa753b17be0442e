"""``--soak N`` (tests/conftest.py): every fault scenario N times over, as ``[soak-K]``."""

from __future__ import annotations

import pytest


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    rounds = int(metafunc.config.getoption("soak"))
    if rounds < 1:
        raise pytest.UsageError(f"--soak must be at least 1, got {rounds}")
    if rounds > 1 and "soak_round" in metafunc.fixturenames:
        metafunc.parametrize("soak_round", range(1, rounds + 1), ids=lambda k: f"soak-{k}")


@pytest.fixture(autouse=True)
def soak_round(request: pytest.FixtureRequest) -> int:
    """Which of the ``--soak`` rounds this is (1 without the option)."""
    return int(getattr(request, "param", 1))


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("soak"))
