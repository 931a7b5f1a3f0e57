"""Timing helpers: percentiles, timed loops and the A B A B alternation."""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "Latencies",
    "alternate",
    "keep_in_flight",
    "keep_window",
    "percentile",
    "timed",
    "timed_async",
]

T = TypeVar("T")
H = TypeVar("H")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(frozen=True)
class Latencies:
    """Durations in seconds, with the percentiles the tables report."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, blocks: Sequence[Sequence[float]]) -> Latencies:
        """All the durations of several blocks."""
        return cls(tuple(v for block in blocks for v in block))

    @property
    def p50(self) -> float:
        return percentile(self.values, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.values, 0.99)

    def __len__(self) -> int:
        return len(self.values)


def timed(call: Callable[[], object], n: int) -> list[float]:
    """Call ``call`` ``n`` times in sequence; the duration of each call."""
    durations = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        durations.append(time.perf_counter() - start)
    return durations


async def timed_async(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    """Await ``call()`` ``n`` times in sequence; the duration of each call."""
    durations = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        durations.append(time.perf_counter() - start)
    return durations


def alternate(sides: Sequence[tuple[str, Callable[[], T]]], rounds: int) -> dict[str, list[T]]:
    """Run each side's block in turn, A B C A B C ..., ``rounds`` times.

    Drift on a shared machine (another tenant, a CPU frequency change) then lands on
    every side alike instead of on whichever ran last.
    """
    results: dict[str, list[T]] = {name: [] for name, _ in sides}
    for _ in range(rounds):
        for name, block in sides:
            results[name].append(block())
    return results


async def keep_in_flight(
    call: Callable[[], Awaitable[object]], in_flight: int, total: int
) -> float:
    """Make ``total`` calls, ``in_flight`` outstanding at any time; the seconds it took.

    Each of ``in_flight`` lanes calls again as soon as its call returns.
    """
    remaining = total

    async def lane() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return time.perf_counter() - start


def keep_window(
    send: Callable[[], H], wait: Callable[[H], object], in_flight: int, total: int
) -> float:
    """``keep_in_flight`` for a blocking client in one thread; the seconds it took.

    ``send()`` starts a call and returns its handle, ``wait(handle)`` blocks until that
    call's result is back. Up to ``in_flight`` calls are outstanding: the oldest is
    waited for, then the next one sent.
    """
    window: deque[H] = deque()
    sent = 0
    start = time.perf_counter()
    while sent < total or window:
        while sent < total and len(window) < in_flight:
            window.append(send())
            sent += 1
        wait(window.popleft())
    return time.perf_counter() - start
