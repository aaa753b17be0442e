"""How long a grant taken straight from a store (nobody renews it) takes to lapse there."""

from __future__ import annotations

import math

from tenure.stores import Store


def lapse(store: Store, ttl: float) -> float:
    """Seconds after which a raw grant of ``ttl`` has surely expired in ``store``.

    etcd counts lease TTLs in whole seconds and revokes expired leases from a
    loop that runs every 500 ms; the other stores expire to the millisecond.
    """
    if store.scheme == "etcd":
        return math.ceil(ttl) + 0.7
    return ttl + 0.1
