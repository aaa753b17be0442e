"""The control board: small keyed records that every instance reads, the
third part of the store contract (after ``stores.base`` and ``stores.runlog``).

Operators act on a cluster through it (``tenure.control``): which tasks the
schedulers serve, which are paused, which are asked to run now, and the audit
record of each action. A board is a set of *kinds* (``tasks``, ``control``,
``audit``), each a map of keys to text values (JSON, written and read by
``tenure.control`` only). Every store offers its board as part of its run log
(``store.runlog``); a kind holds hundreds of entries, not millions.

The rules of ``stores.base`` hold here too: each method is one atomic step in
the store, driver errors surface as StoreUnavailable. Keys are at most
``BOARD_KEY_BYTES`` UTF-8 bytes, kinds at most 32 ASCII characters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

__all__ = ("BOARD_KEY_BYTES", "Board")

BOARD_KEY_BYTES = 320
"""The longest key, in UTF-8 bytes: a task's name (255) and a short tag."""


class Board(ABC):
    """Keyed text records in kinds (see the module docstring)."""

    @abstractmethod
    async def board(self, kind: str) -> dict[str, str]:
        """Every entry of ``kind``, as one consistent read."""

    @abstractmethod
    async def board_swap(self, kind: str, key: str, expect: str | None, value: str | None) -> bool:
        """Compare-and-set the entry ``key`` of ``kind``.

        When its value is ``expect`` (None: there is no entry), it becomes
        ``value`` (None: the entry is removed) and True is returned; else
        nothing changes and False is returned.
        """

    @abstractmethod
    async def board_put(self, kind: str, values: Mapping[str, str]) -> None:
        """Set each entry of ``values`` in ``kind``, whatever it was (at most
        ``Store.batch_max`` of them; one atomic step)."""
