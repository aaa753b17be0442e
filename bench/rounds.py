"""Timing shared by the benchmarks: a contender's mean time per call, and
contenders measured in interleaved rounds (so that a noisy spell of the
machine falls on all of them alike), reduced to medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Mapping

__all__ = ("interleaved", "report", "time_async", "time_sync")


async def time_async(fn: Callable[[], Awaitable[object]], n: int) -> float:
    """Seconds per call of ``n`` calls of ``fn``, one after another."""
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n


def time_sync(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of ``n`` calls of ``fn``, one after another."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


async def interleaved(
    contenders: Mapping[str, Callable[[], Awaitable[object]]],
    n: int,
    rounds: int,
    *,
    warm_up: int = 50,
) -> dict[str, float]:
    """Each contender's median seconds per call over ``rounds`` rounds of ``n``
    calls, the contenders taking turns within each round; ``warm_up`` calls
    each first (connections, prepared statements, tables)."""
    for fn in contenders.values():
        await time_async(fn, warm_up)
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            results[name].append(await time_async(fn, n))
    return {name: statistics.median(times) for name, times in results.items()}


def report(title: str, medians: Mapping[str, float], against: Mapping[str, str]) -> None:
    """Print each median in µs and as a ratio to each contender named in
    ``against`` (a label for the ratio -> the contender's name)."""
    print(title)
    width = max(len(name) for name in medians)
    for name, value in medians.items():
        ratios = "".join(
            f"   {value / medians[other]:5.2f}x {label}" for label, other in against.items()
        )
        print(f"  {name:{width}s} {value * 1e6:8.1f} µs{ratios}")
