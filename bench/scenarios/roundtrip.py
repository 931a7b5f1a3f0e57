"""1. Sequential no-op round trip: toolexec, plain Celery and a hand-written floor.

One caller, one call at a time, a tool that does nothing: what is left is the cost of
the path itself. Plain Celery is ``send_task(...).get()`` with a Redis result backend
on the same broker, pool and concurrency; the floor is an LPUSH of a request and a
BRPOP of its reply, with a server that does nothing else. Beside the plain call, a
submitted one (``tool.submit({}).result_sync()``: the same call with a record another
process can attach to), and the ratio of their medians; and ``submit()`` alone, which
returns once the call is durably queued (the latency a sender pays before it may exit).
toolexec is also measured on a second pool (``Sizes.throughput_pool``: the asyncio pool,
``-c`` as in scenario 2) by a worker of its own, the same sync call to the same no-op,
its blocks alternated with the others; over RabbitMQ (``--broker amqp``) only the shared
pool is measured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from agent_client import RemoteTool
from bench import names, raw_celery
from bench.harness import Bench
from bench.report import Figure, Goal, ScenarioResult, Table, count, ms, ratio
from bench.stats import Latencies, alternate, timed, timed_async

NUMBER = 1
TITLE = "Sequential no-op round trip"

_TIMEOUT = 10.0
_TOOLEXEC = "toolexec (sync)"
_TOOLEXEC_ASYNC = "toolexec (asyncio)"
_SUBMITTED = "toolexec submitted (sync)"
_SUBMIT_RETURNS = "toolexec submit() alone (durably queued)"
_RAW = "raw Celery send_task().get()"
_FLOOR = "Redis RPC floor (LPUSH + BRPOP)"


def run(bench: Bench) -> ScenarioResult:
    """Alternate blocks of sequential calls of every side; compare their percentiles."""
    second = bench.sizes.throughput_pool
    if second == bench.options.pool or bench.options.broker == "amqp":
        second = None  # over RabbitMQ the run's queues are its own (bench.amqp)
    with contextlib.ExitStack() as stack:
        label = None
        if second is not None:
            concurrency = bench.sizes.throughput_pool_concurrency
            stack.enter_context(
                bench.toolexec_workers(
                    [(f"roundtrip-{second}", (names.POOL_QUEUE,))], second, concurrency
                )
            )
            label = f"toolexec (sync), {second} -c {concurrency}"
        return _measure(bench, label)


def _submit_only(noop: RemoteTool, n: int) -> list[float]:
    """How long ``submit()`` takes to return, ``n`` times; each call's result is then
    awaited untimed, so the calls do not pile up."""
    durations = []
    for _ in range(n):
        start = time.perf_counter()
        handle = noop.submit({}, timeout=_TIMEOUT)
        durations.append(time.perf_counter() - start)
        handle.result_sync(timeout=_TIMEOUT)
    return durations


def _measure(bench: Bench, second: str | None) -> ScenarioResult:
    noop = bench.tool("noop")

    async def toolexec_async() -> object:
        return await noop.invoke({}, timeout=_TIMEOUT)

    blocks: dict[str, Callable[[int], list[float]]] = {
        _TOOLEXEC: lambda n: timed(lambda: noop.invoke_sync({}, timeout=_TIMEOUT), n),
        _TOOLEXEC_ASYNC: lambda n: bench.run(timed_async(toolexec_async, n)),
        _SUBMITTED: lambda n: timed(
            lambda: noop.submit({}, timeout=_TIMEOUT).result_sync(timeout=_TIMEOUT), n
        ),
        _SUBMIT_RETURNS: lambda n: _submit_only(noop, n),
        _RAW: lambda n: timed(
            lambda: bench.celery.send_task(raw_celery.NOOP).get(timeout=_TIMEOUT), n
        ),
        _FLOOR: lambda n: timed(lambda: bench.rpc.call(timeout=_TIMEOUT), n),
    }
    if second is not None:
        other = bench.tool("noop_pool")  # once its worker serves it
        blocks[second] = lambda n: timed(lambda: other.invoke_sync({}, timeout=_TIMEOUT), n)
    for block in blocks.values():
        block(bench.sizes.warmup)
    n = bench.sizes.roundtrip_calls
    results = alternate(
        [(name, _bind(block, n)) for name, block in blocks.items()], bench.sizes.rounds
    )
    latencies = {name: Latencies.of(runs) for name, runs in results.items()}

    raw_p50 = latencies[_RAW].p50
    rows = [
        (name, count(len(lat)), ms(lat.p50), ms(lat.p99), ratio(lat.p50 / raw_p50))
        for name, lat in latencies.items()
    ]
    measured = latencies[_TOOLEXEC].p50 / raw_p50
    shared = f"{bench.options.pool} -c {bench.options.concurrency}"
    pool_goals = [(f"toolexec (sync), {shared}", measured)]
    if second is not None:
        pool_goals.append((second, latencies[second].p50 / raw_p50))
    submitted = latencies[_SUBMITTED].p50 / latencies[_TOOLEXEC].p50
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(columns=("side", "calls", "p50 ms", "p99 ms", "p50 vs raw Celery"), rows=rows)
        ],
        goals=[
            Goal(
                name="toolexec (sync) p50 / raw Celery p50",
                measured=ratio(measured),
                target="≤ 0.40×",  # issue 11's goal
                met=measured <= 0.4,
            ),
            *(
                Goal(
                    name=f"{name} p50 / raw Celery ({shared}) p50",
                    measured=ratio(value),
                    target="≤ 0.50×",  # issue 21's goal, on every pool
                    met=value <= 0.5,
                )
                for name, value in pool_goals
            ),
        ],
        notes=[
            (
                f"{bench.sizes.rounds} rounds of {n} calls per side, one block of each side in "
                f"turn; {bench.sizes.warmup} warm-up calls each."
            ),
            (
                f"Submitted (sync) p50 / toolexec (sync) p50: {ratio(submitted)} "
                f"({ms(latencies[_SUBMITTED].p50)} vs {ms(latencies[_TOOLEXEC].p50)} ms)."
            ),
            (
                "submit() returns once its record and message are confirmed: its p50 "
                f"{ms(latencies[_SUBMIT_RETURNS].p50)} ms, p99 "
                f"{ms(latencies[_SUBMIT_RETURNS].p99)} ms (the latency it adds before the caller "
                f"may walk away; the floor's whole round trip is {ms(latencies[_FLOOR].p50)} ms)."
            ),
        ],
        figures=[
            Figure(
                name="latency",
                title=(
                    "Sequential no-op round trip, "
                    f"{bench.options.pool} -c {bench.options.concurrency} workers"
                ),
                kind="bars",
                x_label="side",
                y_label="milliseconds",
                series={
                    label: [(name, percentile(lat) * 1000) for name, lat in latencies.items()]
                    for label, percentile in _PERCENTILES
                },
            )
        ],
    )


_PERCENTILES: list[tuple[str, Callable[[Latencies], float]]] = [
    ("p50", lambda lat: lat.p50),
    ("p99", lambda lat: lat.p99),
]


def _bind(block: Callable[[int], list[float]], n: int) -> Callable[[], list[float]]:
    return lambda: block(n)
