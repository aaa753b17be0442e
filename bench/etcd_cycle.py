"""etcd: uncontended acquire+release against two plain gets of the same client.

Starts its own throwaway three-member etcd cluster (the tests' helper) unless
``--url`` is given. In interleaved rounds:

* two ``Range`` calls (a get) on the store's own gRPC channel: the round-trip floor;
* two gets through aetcd's own client (``aetcd.Client.get``), for reference;
* tenure's acquire+release (a transaction with a keep-alive beside it, then a
  compare-and-delete transaction, renewer registration).

    python bench/etcd_cycle.py [--n 1000] [--rounds 5] [--url etcd://...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import aetcd
from aetcd import rpc

from rounds import interleaved, report
from tenure import LockService
from tenure.stores.etcd import EtcdStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import EtcdCluster


async def run(url: str, n: int, rounds: int) -> None:
    async with LockService.from_url(url) as locks:
        store = locks.store
        assert isinstance(store, EtcdStore)
        host, port = store.endpoints[0]
        key = f"{store.prefix}/bench-get".encode()

        async def two_gets() -> None:
            await store.transport.call("Range", "kv", rpc.RangeRequest(key=key))
            await store.transport.call("Range", "kv", rpc.RangeRequest(key=key))

        async with aetcd.Client(host=host, port=port) as client:

            async def two_aetcd_gets() -> None:
                await client.get(key)
                await client.get(key)

            async def tenure_cycle() -> None:
                lock = await locks.acquire("bench:tenure")
                assert lock is not None
                await lock.release()

            contenders = {
                "two gets (tenure's channel)": two_gets,
                "two gets (aetcd.Client)": two_aetcd_gets,
                "tenure acquire+release": tenure_cycle,
            }
            medians = await interleaved(contenders, n, rounds)
    report(
        f"etcd uncontended acquire+release, {rounds} rounds x {n} (median):",
        medians,
        {"two gets": "two gets (tenure's channel)"},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        asyncio.run(run(args.url, args.n, args.rounds))
        return
    cluster = EtcdCluster()
    try:
        asyncio.run(run(cluster.url, args.n, args.rounds))
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
