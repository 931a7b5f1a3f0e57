"""1. Sequential no-op round trip: toolexec, plain Celery and a hand-written floor.

One caller, one call at a time, a tool that does nothing: what is left is the cost of
the path itself. Plain Celery is ``send_task(...).get()`` with a Redis result backend
on the same broker, pool and concurrency; the floor is an LPUSH of a request and a
BRPOP of its reply, with a server that does nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from bench import raw_celery
from bench.harness import Bench
from bench.report import Figure, Goal, ScenarioResult, Table, count, ms, ratio
from bench.stats import Latencies, alternate, timed, timed_async

NUMBER = 1
TITLE = "Sequential no-op round trip"

_TIMEOUT = 10.0
_TOOLEXEC = "toolexec (sync)"
_TOOLEXEC_ASYNC = "toolexec (asyncio)"
_RAW = "raw Celery send_task().get()"
_FLOOR = "Redis RPC floor (LPUSH + BRPOP)"


def run(bench: Bench) -> ScenarioResult:
    """Alternate blocks of sequential calls of every side; compare their percentiles."""
    noop = bench.tool("noop")

    async def toolexec_async() -> object:
        return await noop.invoke({}, timeout=_TIMEOUT)

    blocks: dict[str, Callable[[int], list[float]]] = {
        _TOOLEXEC: lambda n: timed(lambda: noop.invoke_sync({}, timeout=_TIMEOUT), n),
        _TOOLEXEC_ASYNC: lambda n: bench.run(timed_async(toolexec_async, n)),
        _RAW: lambda n: timed(
            lambda: bench.celery.send_task(raw_celery.NOOP).get(timeout=_TIMEOUT), n
        ),
        _FLOOR: lambda n: timed(lambda: bench.rpc.call(timeout=_TIMEOUT), n),
    }
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
            )
        ],
        notes=[
            f"{bench.sizes.rounds} rounds of {n} calls per side, A B C D A B C D ...; {bench.sizes.warmup} warm-up calls each."
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
