"""The semaphore rules' ``Ledger.reached``: which waiters a release wakes
(the SQLite store sends its datagrams to these alone); and ``Ledger.needs``:
how many releases a waiter still needs (MySQL's polling waiters read it)."""

from __future__ import annotations

from tenure.stores.base import Grant
from tenure.stores.semaphores import Ledger, Queued


def _ledger_of_two_with_four_waiting() -> Ledger:
    ledger = Ledger()
    assert isinstance(ledger.acquire("s", "p1", 100, "h", 2, queue=10, now=0), Grant)
    assert isinstance(ledger.acquire("s", "p2", 100, "h", 2, queue=10, now=0), Grant)
    for token in ("w1", "w2", "w3", "w4"):
        assert isinstance(ledger.acquire("s", token, 100, "h", 2, queue=10, now=0), Queued)
    return ledger


def test_a_release_reaches_as_many_waiters_as_it_frees_in_queue_order() -> None:
    ledger = _ledger_of_two_with_four_waiting()
    assert ledger.reached(now=1) == [], "no permit free: nobody is reached"
    assert ledger.release("p1", now=1)
    assert ledger.reached(now=1) == ["w1"]
    assert ledger.release("p2", now=1)
    assert ledger.reached(now=1) == ["w1", "w2"]


def test_lapsed_permits_free_places_and_lapsed_waiters_are_passed_over() -> None:
    ledger = _ledger_of_two_with_four_waiting()
    assert ledger.renew("p2", 200, now=5)  # p1 lapses at 100, p2 lives to 205
    assert ledger.acquire("s", "w2", 100, "h", 2, queue=200, now=5) == Queued(1)
    assert ledger.acquire("s", "w3", 100, "h", 2, queue=200, now=5) == Queued(2)
    # At 150: p1 and the queue entries of w1 and w4 (until 10) have lapsed.
    assert ledger.reached(now=150) == ["w2"]
    assert ledger.release("p2", now=150)
    assert ledger.reached(now=150) == ["w2", "w3"]


def test_needs_counts_the_releases_between_a_waiter_and_a_permit() -> None:
    now = 100.0
    ledger = Ledger(2, 7, {"a": ["h", now + 5, 6, 0.0], "b": ["h", now - 1, 7, 0.0]}, [])
    ledger.queue = [["w1", now + 5], ["gone", now - 1], ["w2", now + 5], ["w3", now + 5]]
    # One live permit of two: w1 is reached now, w2 needs one release, w3 two.
    assert [ledger.needs(t, now) for t in ("w1", "w2", "w3")] == [0, 1, 2]
    assert ledger.needs("a", now) == 0, "a permit held already"
    assert Ledger().needs("first", now) == 0, "an idle semaphore takes the caller's limit"
    # The same rule from the release's side: the tokens a freed permit reaches.
    assert ledger.reached(now) == ["w1"]
