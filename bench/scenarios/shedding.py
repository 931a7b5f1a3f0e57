"""6. Shedding: with the only worker busy, how many queued calls whose callers timed out still run.

For each pool a worker with one process serves a queue of its own. A long call keeps
it busy; N calls of a marker tool queue behind it with a deadline that passes before
the worker is free. Every run of the marker increments a Redis counter, so the counter
is the number of calls that ran for nobody. Plain Celery is measured the same way,
once as most code calls it (``get(timeout=)`` only) and once with ``expires=`` set to
the caller's deadline, Celery's own mechanism.
"""

from __future__ import annotations

import asyncio
import time

from agent_client import ToolTimeoutError
from bench import names, raw_celery
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table

NUMBER = 6
TITLE = "Shedding: queued calls that still run after their callers timed out"

_DEADLINE = 0.3
_BUSY_MS = 1000


def run(bench: Bench) -> ScenarioResult:
    """Count the marker runs for toolexec and plain Celery on every pool."""
    n = bench.sizes.shed_calls
    rows, goals = [], []
    for pool in bench.sizes.shed_pools:
        with (
            bench.toolexec_workers([(f"shed-{pool}", (names.SHED_QUEUE,))], pool, 1),
            bench.raw_worker(f"raw-shed-{pool}", pool, 1, names.RAW_SHED_QUEUE),
        ):
            timed_out, ran = _toolexec(bench, n)
            raw_plain = _raw(bench, n, expires=None)
            raw_expires = _raw(bench, n, expires=_DEADLINE)
        rows.append((pool, f"{timed_out}/{n}", str(ran), str(raw_plain), str(raw_expires)))
        goals.append(
            Goal(
                name=f"toolexec shed calls that ran, {pool} pool",
                measured=f"{ran}/{n}",
                target="0",
                met=ran == 0,
            )
        )
    columns = (
        "pool",
        "toolexec callers timed out",
        "toolexec ran anyway",
        "raw Celery get(timeout=) ran anyway",
        "raw Celery expires= ran anyway",
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[Table(columns=columns, rows=rows)],
        goals=goals,
        notes=[
            (
                f"One worker process (-c 1) per pool, busy for {_BUSY_MS} ms; {n} queued calls "
                f"with a {_DEADLINE:g} s deadline."
            )
        ],
    )


def _toolexec(bench: Bench, n: int) -> tuple[int, int]:
    """(callers that timed out, marker calls that ran although their caller had gone)."""
    bench.redis.delete(names.SHED_RAN, names.SHED_BUSY)
    busy, mark = bench.tool("shed_busy"), bench.tool("shed_mark")

    async def scenario() -> list[BaseException | None]:
        hold = asyncio.ensure_future(busy.invoke({"ms": _BUSY_MS}, timeout=_BUSY_MS / 1000 + 30))
        await _until_busy(bench)
        outcomes = await asyncio.gather(
            *(mark.invoke({}, timeout=_DEADLINE) for _ in range(n)), return_exceptions=True
        )
        await hold
        return [o if isinstance(o, BaseException) else None for o in outcomes]

    outcomes = bench.run(scenario())
    bench.wait_idle([names.SHED_QUEUE], settle=0.5)
    timed_out = sum(isinstance(o, ToolTimeoutError) for o in outcomes)
    answered = sum(o is None for o in outcomes)
    return timed_out, int(bench.redis.get(names.SHED_RAN) or 0) - answered


def _raw(bench: Bench, n: int, *, expires: float | None) -> int:
    """Marker tasks that ran after their callers' deadline passed."""
    bench.redis.delete(names.SHED_RAN_RAW, names.SHED_BUSY)
    bench.celery.send_task(
        raw_celery.SHED_BUSY, kwargs={"ms": _BUSY_MS}, queue=names.RAW_SHED_QUEUE
    )
    bench.run(_until_busy(bench))
    for _ in range(n):
        bench.celery.send_task(raw_celery.SHED_MARK, queue=names.RAW_SHED_QUEUE, expires=expires)
    # The callers wait out their deadline in get(timeout=) and go; nothing revokes the tasks.
    time.sleep(_DEADLINE)
    while bench.redis.exists(names.SHED_BUSY):
        time.sleep(0.02)
    bench.wait_idle([names.RAW_SHED_QUEUE], settle=0.5)
    return int(bench.redis.get(names.SHED_RAN_RAW) or 0)


async def _until_busy(bench: Bench, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not bench.redis.exists(names.SHED_BUSY):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the shedding worker did not start its busy call within {timeout}s")
        await asyncio.sleep(0.01)
