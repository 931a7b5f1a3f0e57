"""2. Throughput from one client process with 1, 10, 100 and 1,000 calls in flight.

toolexec keeps N calls in flight with asyncio (N coroutines, each calling again as soon
as its call returns). Plain Celery gets its best single-thread pattern (send N, then
``.get()`` each, repeat) and the thread pattern (N threads, each ``send_task().get()``
in a loop). Every block calls the no-op tool; the sides alternate at each level.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable

from agent_client import RemoteTool
from bench import raw_celery
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table, rate, ratio
from bench.stats import alternate, keep_in_flight

NUMBER = 2
TITLE = "Throughput with 1, 10, 100 and 1,000 calls in flight"

_TIMEOUT = 120.0
_TOOLEXEC = "toolexec asyncio"
_RAW_BEST = "raw Celery send all, then .get() each"
_RAW_THREADS = "raw Celery threads calling .get()"


def run(bench: Bench) -> ScenarioResult:
    """Calls per second of each side at each level, from alternated blocks."""
    noop = bench.tool("noop")
    rows = []
    best_ratio, level = float("nan"), 0
    for in_flight in bench.sizes.in_flight:
        total = bench.sizes.throughput_block(in_flight)
        sides: list[tuple[str, Callable[[], float]]] = [
            (_TOOLEXEC, functools.partial(_toolexec, bench, noop, in_flight, total)),
            (_RAW_BEST, functools.partial(_raw_send_all_then_get, bench, in_flight, total)),
            (_RAW_THREADS, functools.partial(_raw_threads, bench, in_flight, total)),
        ]
        elapsed = alternate(sides, bench.sizes.throughput_rounds)
        rates = {name: total * len(times) / sum(times) for name, times in elapsed.items()}
        best_ratio, level = rates[_TOOLEXEC] / rates[_RAW_BEST], in_flight
        rows.append(
            (
                f"{in_flight:,}",
                f"{total:,}",
                *(rate(rates[name]) for name, _ in sides),
                ratio(best_ratio),
            )
        )
    columns = ("in flight", "calls per block", f"{_TOOLEXEC} calls/s", f"{_RAW_BEST} calls/s",
               f"{_RAW_THREADS} calls/s", "toolexec / raw best")  # fmt: skip
    goal = Goal(
        name=f"toolexec / raw Celery best pattern at {level:,} in flight",
        measured=ratio(best_ratio),
        target="≥ 2.00× at 1,000",
        met=(best_ratio >= 2.0) if level == 1000 else None,
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[Table(columns=columns, rows=rows)],
        goals=[goal],
        notes=[
            f"{bench.sizes.throughput_rounds} alternated blocks per side and level; calls/s is all calls over all block time."
        ],
    )


def _toolexec(bench: Bench, tool: RemoteTool, in_flight: int, total: int) -> float:
    return bench.run(keep_in_flight(lambda: tool.invoke({}, timeout=_TIMEOUT), in_flight, total))


def _raw_send_all_then_get(bench: Bench, in_flight: int, total: int) -> float:
    start = time.perf_counter()
    done = 0
    while done < total:
        batch = min(in_flight, total - done)
        results = [bench.celery.send_task(raw_celery.NOOP) for _ in range(batch)]
        for result in results:
            result.get(timeout=_TIMEOUT)
        done += batch
    return time.perf_counter() - start


def _raw_threads(bench: Bench, in_flight: int, total: int) -> float:
    tickets = itertools.count()  # next() on a count is atomic under the GIL
    errors: list[BaseException] = []

    def lane() -> None:
        try:
            while next(tickets) < total:
                bench.celery.send_task(raw_celery.NOOP).get(timeout=_TIMEOUT)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=lane, name=f"bench-get-{i}") for i in range(in_flight)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed
