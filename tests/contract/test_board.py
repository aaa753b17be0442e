"""The control board (``stores.board``) on every store: compare-and-set, batch
put, reads of one kind, across two services of one store."""

from __future__ import annotations

import asyncio

from tenure import LockService
from tenure.stores.board import BOARD_KEY_BYTES


async def test_swap_creates_replaces_and_removes_only_what_it_expects(
    locks: LockService, other: LockService
) -> None:
    mine, theirs = locks.store.runlog, other.store.runlog
    assert await mine.board("k") == {}
    assert await mine.board_swap("k", "a", None, "1")
    assert not await theirs.board_swap("k", "a", None, "2")  # it exists
    assert not await theirs.board_swap("k", "a", "0", "2")  # not what it holds
    assert await theirs.board_swap("k", "a", "1", "2")
    assert await mine.board("k") == {"a": "2"}
    assert not await mine.board_swap("k", "a", "1", None)
    assert not await mine.board_swap("k", "missing", "x", None)
    assert await mine.board_swap("k", "a", "2", None)
    assert await theirs.board("k") == {}
    assert await mine.board_swap("k", "a", None, None)  # absent, and stays so


async def test_kinds_are_apart_and_put_sets_whatever_was_there(
    locks: LockService, other: LockService
) -> None:
    board = locks.store.runlog
    long_key = "t" * (BOARD_KEY_BYTES - 8) + "é" * 4
    await board.board_put("one", {"a": "1", "b": '{"x": "ü"}', long_key: "long"})
    await other.store.runlog.board_put("one", {"a": "3"})
    await board.board_put("two", {"a": "other kind"})
    await board.board_put("one", {})
    assert await other.store.runlog.board("one") == {"a": "3", "b": '{"x": "ü"}', long_key: "long"}
    assert await board.board("two") == {"a": "other kind"}
    many = {f"task-{i:04}": str(i) for i in range(locks.store.batch_max)}
    await board.board_put("many", many)
    assert await other.store.runlog.board("many") == many


async def test_concurrent_swaps_of_one_value_have_one_winner(
    locks: LockService, other: LockService
) -> None:
    await locks.store.runlog.board_put("k", {"n": "0"})
    stores = [locks.store.runlog, other.store.runlog] * 10
    wins = await asyncio.gather(
        *(s.board_swap("k", "n", "0", f"w{i}") for i, s in enumerate(stores))
    )
    assert sum(wins) == 1
    [winner] = [i for i, won in enumerate(wins) if won]
    assert await other.store.runlog.board("k") == {"n": f"w{winner}"}
