"""8. Async tools: 1,000 calls to an ``async def`` tool that awaits 1 s, on one worker process.

toolexec's asyncio pool (``-P custom``, :mod:`executor.pools.asyncio_pool`) runs the
calls as coroutines on one event loop, ``-c`` as large as the number of calls. Beside it,
the same tool through toolexec on Celery's stock pools: threads with ``-c 100`` and
gevent with ``-c`` as large as the number of calls (one greenlet per call, as the
asyncio pool has one coroutine per call), and prefork with ``-c 2`` (the default on a
2-core machine), where each call holds a thread or a process for its whole second.

On gevent an ``async def`` tool cannot wait concurrently: each call runs its coroutine
on an event loop of the worker's one OS thread, and asyncio allows one running loop per
OS thread, however many greenlets share it. The gevent pool is therefore also measured
the way gevent runs waiting code: the same 1 s wait in a ``def`` tool
(``blocking_sleep_ms``: ``time.sleep``, which Celery's gevent pool monkey-patches, so
the wait yields to the other greenlets). gevent is in the ``bench`` extra; only that
worker process imports it (Celery's ``-P gevent`` patches at its start).

Prefork with ``-c 2`` would need 500 s for 1,000 calls: it makes fewer calls, and its
time for the full number is extrapolated (calls / 2 rounds of 1 s each), as the table
says. Each side starts its own worker on a queue of its own, one side at a time, and
counts the OS threads of the worker's processes while the calls are in flight, and
their CPU time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from agent_client import RemoteTool, RemoteToolError
from bench import names
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table, count
from toolexec import Pool, WorkerProcess

NUMBER = 8
TITLE = "Async tools: 1,000 calls awaiting 1 s on one worker process"

_AWAIT_MS = 1000
_TIMEOUT = 600.0
_SAMPLE = 0.02
#: The issue's goals for the asyncio pool at 1,000 calls.
_GOAL_SECONDS = 1.5
_GOAL_THREADS = 8


@dataclass(frozen=True, kw_only=True)
class _Side:
    name: str
    pool: Pool
    concurrency: int
    calls: int
    #: The tool the calls go to: the async one, or the same wait in a ``def`` tool.
    tool: str = "async_sleep_ms"
    may_fail: bool = False


@dataclass(frozen=True, kw_only=True)
class _Measured:
    seconds: float
    peak_threads: int
    cpu_seconds: float
    #: Why the calls failed, on a side that may fail (gevent); None when they all succeeded.
    failure: str | None = None


def run(bench: Bench) -> ScenarioResult:
    """Wall time, threads and CPU of each pool for the same calls."""
    n = bench.sizes.async_calls
    gevent = cast(Pool, "gevent")  # a Celery pool toolexec's launchers do not name
    sides = [
        _Side(name="toolexec asyncio pool", pool="asyncio", concurrency=n, calls=n),
        _Side(name="Celery threads pool", pool="threads", concurrency=100, calls=n),
        *(
            [
                _Side(
                    name="Celery gevent pool", pool=gevent, concurrency=n, calls=n, may_fail=True
                ),
                _Side(
                    name="Celery gevent pool, the wait in a def tool",
                    pool=gevent,
                    concurrency=n,
                    calls=n,
                    tool="blocking_sleep_ms",
                    may_fail=True,
                ),
            ]
            if _has_gevent()
            else []
        ),
        _Side(
            name="Celery prefork pool",
            pool="prefork",
            concurrency=2,
            calls=bench.sizes.async_prefork_calls,
        ),
    ]
    measured = {side.name: _measure(bench, side) for side in sides}
    rows, failures = [], []
    for side in sides:
        m = measured[side.name]
        if m.failure is not None:
            rows.append(
                (
                    side.name,
                    _TOOL_KINDS[side.tool],
                    f"-c {side.concurrency}",
                    count(side.calls),
                    "failed",
                    "–",
                    str(m.peak_threads),
                    "–",
                )
            )
            failures.append(f"{side.name}: the calls failed ({m.failure}).")
            continue
        extrapolated = side.calls < n
        full = m.seconds * n / side.calls if extrapolated else m.seconds
        rows.append(
            (
                side.name,
                _TOOL_KINDS[side.tool],
                f"-c {side.concurrency}",
                count(side.calls),
                f"{m.seconds:.2f}",
                f"{full:.1f} (extrapolated)" if extrapolated else f"{full:.2f}",
                str(m.peak_threads),
                f"{m.cpu_seconds * 1000 / side.calls:.2f}",
            )
        )
    aio = measured["toolexec asyncio pool"]
    stock = [
        (measured[side.name].seconds * n / side.calls, side.name)
        for side in sides
        if side.pool != "asyncio" and measured[side.name].failure is None
    ]
    best_time, best_name = min(stock) if stock else (math.nan, "none")
    columns = (
        "side",
        "tool",
        "concurrency",
        "calls",
        "wall s",
        f"wall s for {n:,} calls",
        "peak threads",
        "worker CPU ms per call",
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[Table(columns=columns, rows=rows)],
        goals=[
            Goal(
                name=f"asyncio pool, {n:,} calls awaiting 1 s on one process",
                measured=f"{aio.seconds:.2f} s",
                target=f"≤ {_GOAL_SECONDS:g} s at 1,000",
                met=(aio.seconds <= _GOAL_SECONDS) if n == 1000 else None,
            ),
            Goal(
                name=f"asyncio pool threads, {n:,} calls in flight",
                measured=str(aio.peak_threads),
                target=f"≤ {_GOAL_THREADS}",
                met=aio.peak_threads <= _GOAL_THREADS,
            ),
        ],
        notes=[
            (
                f"Every call waits {_AWAIT_MS} ms: awaits it (`async_sleep_ms`), or sleeps it in a "
                f"def tool where the tool column says so (`blocking_sleep_ms`); all {n:,} are sent "
                "at once from one client process."
            ),
            (
                f"Prefork -c 2 makes {bench.sizes.async_prefork_calls} calls; its time for {n:,} "
                f"is {n:,}/{bench.sizes.async_prefork_calls} times that."
            ),
            (
                "Threads are the OS threads of the worker's processes (the main process and its "
                f"pool children), sampled every {_SAMPLE * 1000:g} ms; CPU is theirs too, from "
                "/proc."
            ),
            (
                f"Best stock Celery pool for the same wait: {best_name}, {best_time:.2f} s for "
                f"{n:,} calls, against the asyncio pool's {aio.seconds:.2f} s."
            ),
            (
                "gevent (the bench extra) runs with -c as large as the number of calls, one "
                "greenlet per call as the asyncio pool has one coroutine per call; its second row "
                "is the same wait in a def tool (time.sleep, monkey-patched by the pool)."
                if _has_gevent()
                else "gevent is not installed (pip install 'toolexec[bench]'): not measured."
            ),
            *failures,
        ],
    )


#: What each tool's wait is, for the table.
_TOOL_KINDS = {"async_sleep_ms": "async def", "blocking_sleep_ms": "def (time.sleep)"}


def _has_gevent() -> bool:
    # Only found, never imported: gevent's monkey-patching stays in its worker process.
    return importlib.util.find_spec("gevent") is not None


def _measure(bench: Bench, side: _Side) -> _Measured:
    with bench.toolexec_workers(
        [(f"async-{side.pool}", (names.ASYNC_QUEUE,))], side.pool, side.concurrency
    ) as (worker,):
        tool = bench.tool(side.tool)
        cpu_before = _cpu_seconds(worker)
        try:
            bench.run(
                tool.invoke({"ms": 0}, timeout=60.0)
            )  # warm: the pool and the listener are up
            cpu_before = _cpu_seconds(worker)
            seconds, peak = bench.run(_calls(tool, side.calls, worker))
        except RemoteToolError as exc:
            if not side.may_fail:
                raise
            failure = str(exc)
            return _Measured(
                seconds=math.nan,
                peak_threads=_threads(worker),
                cpu_seconds=math.nan,
                failure=failure,
            )
        cpu = _cpu_seconds(worker) - cpu_before
    return _Measured(seconds=seconds, peak_threads=peak, cpu_seconds=cpu)


async def _calls(tool: RemoteTool, n: int, worker: WorkerProcess) -> tuple[float, int]:
    start = time.perf_counter()
    calls = [
        asyncio.ensure_future(tool.invoke({"ms": _AWAIT_MS}, timeout=_TIMEOUT)) for _ in range(n)
    ]
    pending, peak = set(calls), _threads(worker)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=_SAMPLE)
        peak = max(peak, _threads(worker))
    elapsed = time.perf_counter() - start
    errors = [call.exception() for call in calls]  # retrieves every call's exception
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return elapsed, peak


def _processes(worker: WorkerProcess) -> list[int]:
    return [pid for pid in (worker.pid, *worker.child_pids()) if pid is not None]


def _threads(worker: WorkerProcess) -> int:
    total = 0
    for pid in _processes(worker):
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return total


def _cpu_seconds(worker: WorkerProcess) -> float:
    ticks = 0
    for pid in _processes(worker):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")
