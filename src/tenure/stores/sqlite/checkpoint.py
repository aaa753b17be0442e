"""WAL checkpoints off the callers' threads.

In WAL mode every commit appends to the ``-wal`` file, and by default the
commit that takes it past 1000 pages copies it back into the database and
fsyncs both: a stall of milliseconds on every few hundredth acquire. Here a
thread of the store runs that checkpoint (``PASSIVE``: it never blocks a
writer) after every ``CHECKPOINT_EVERY`` writes, on a connection of its own;
the callers' connections checkpoint by themselves only as a backstop (see
``schema.INLINE_CHECKPOINT_PAGES``). Checkpoints move committed pages; they
change no transaction's outcome.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import weakref
from pathlib import Path

__all__ = ("CHECKPOINT_EVERY", "Checkpointer")

log = logging.getLogger("tenure.sqlite")

CHECKPOINT_EVERY = 200
"""Writes between two background checkpoints: about 200 KB of WAL at 1 KB pages."""


class Checkpointer:
    """A thread that checkpoints a WAL when asked, on a connection of its own.

    It holds no reference to its owner: an owner dropped without ``aclose``
    lets the thread notice within ``_IDLE_EXIT`` seconds and end.
    """

    _IDLE_EXIT = 60.0

    def __init__(self, owner: object, path: Path) -> None:
        self._store = weakref.ref(owner)
        self._path = path
        self._wanted = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.done = 0
        """Checkpoints run so far (for tests and diagnostics)."""
        self.copied = 0
        """WAL frames those checkpoints copied into the database, as SQLite counts them."""

    def request(self) -> None:
        thread = self._thread
        # Not alive: never started, idle long enough to end, or this is a
        # forked child (the thread was the parent's).
        if thread is None or not thread.is_alive():
            if self._stopping:
                return
            thread = self._thread = threading.Thread(
                target=self._main, name="tenure-sqlite-checkpoint", daemon=True
            )
            thread.start()
        self._wanted.set()

    def stop(self) -> None:
        self._stopping = True
        self._wanted.set()
        thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join()

    def _main(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:  # the callers' own statements report why
            log.debug("the SQLite checkpoint thread could not connect: %r", exc)
            return
        try:
            while True:
                if not self._wanted.wait(self._IDLE_EXIT):
                    if self._store() is None:
                        return
                    continue
                if self._stopping:
                    return
                self._wanted.clear()
                try:
                    _busy, _frames, copied = conn.execute(
                        "PRAGMA wal_checkpoint(PASSIVE)"
                    ).fetchone()
                    self.done += 1
                    self.copied += max(copied, 0)
                except sqlite3.Error as exc:
                    # Harmless: the next request tries again, and past
                    # INLINE_CHECKPOINT_PAGES the callers checkpoint by themselves.
                    log.debug("background WAL checkpoint failed: %r", exc)
        finally:
            conn.close()
