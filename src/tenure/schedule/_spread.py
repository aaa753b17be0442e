"""Spreading a tick's occurrences over the live instances.

Every instance claims every occurrence, and the first claim wins. Claimed as
one batch each, a tick's occurrences would all go to whichever instance's
batch reached the store first, which then runs all of them while the others
idle. Instead each task has a *preferred* instance among those serving (their
presence leases): rendezvous hashing of the task's name with each instance's
id, so that the tasks spread evenly and move as little as possible when an
instance comes or goes. An instance claims its own preferred occurrences at
once, and the others ``SPREAD_DELAY`` later: by then their preferred instance
has claimed them (the claim answers "elsewhere"), unless it is dead, stalled
or its clock runs behind, and then this one runs them, that much later.
Nothing is ever left unclaimed: the delay only orders the claims.

Before claiming the others' occurrences, an instance reads which of them are
claimed already (one read per batch) and sends starts only for the rest, so
that in a healthy cluster no claim, lock and record is built and sent to lose.

An instance learns that another one started at its next read of the
instances; until then both may count a task as theirs and claim it at once
(one of them wins it). So an instance reads them every ``PEERS_RECHECK``
during its first ``PEERS_REFRESH`` seconds of ticks (instances that start
together each see the others within a second or two), and again within
``PEERS_RECHECK`` whenever it finds one of its own occurrences claimed
elsewhere (an instance started since its last read).
"""

from __future__ import annotations

import hashlib

__all__ = ("PEERS_RECHECK", "PEERS_REFRESH", "SPREAD_DELAY", "Spread")

SPREAD_DELAY = 0.05
"""Seconds after its own occurrences that an instance claims the others' of a tick."""

PEERS_REFRESH = 5.0
"""Seconds between two reads of which instances serve (their presence leases)."""

PEERS_RECHECK = 1.0
"""Seconds between two reads while an instance starts, or while another one
claims its own occurrences first: a new instance is known within a second
or two, not only at the next PEERS_REFRESH."""


class Spread:
    """Which tasks this instance claims first, given the instances that serve."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.peers: frozenset[str] = frozenset((me,))
        self._mine: dict[str, bool] = {}

    def update(self, serving: set[str], me: str) -> None:
        """The instances serving now, and this one's id (always among them)."""
        peers = frozenset(serving | {me})
        if peers != self.peers or me != self.me:
            self.me, self.peers = me, peers
            self._mine.clear()

    def mine(self, task: str) -> bool:
        """Whether this instance is ``task``'s preferred one."""
        known = self._mine.get(task)
        if known is None:
            if len(self.peers) == 1:
                return True
            known = self._mine[task] = max(self.peers, key=lambda p: _weight(p, task)) == self.me
        return known


def _weight(peer: str, task: str) -> bytes:
    return hashlib.blake2b(f"{peer}\0{task}".encode(), digest_size=8).digest()
