"""7. Scaling: calls per second of a 50 ms I/O-bound tool with 1, 2 and 4 worker processes.

Four single-process workers are started once. Worker i consumes the queue of every
worker count greater than i, and each queue has its own copy of the 50 ms tool, so a
block for N processes calls the tool that exactly N workers serve, and the blocks for
1, 2 and 4 alternate without starting or stopping anything.
"""

from __future__ import annotations

import functools

from agent_client import RemoteTool
from bench import names
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table, rate, ratio
from bench.stats import alternate, keep_in_flight

NUMBER = 7
TITLE = "Scaling: a 50 ms I/O-bound tool on 1, 2 and 4 worker processes"

_TOOL_MS = 50
_TIMEOUT = 120.0
#: Calls in flight per worker process: enough that none waits for work.
_LANES = 4


def run(bench: Bench) -> ScenarioResult:
    """Throughput per worker count; efficiency against N times the one-process rate."""
    counts = names.SCALE_QUEUES
    workers = [
        (f"scale-{i}", tuple(names.scale_queue(n) for n in counts if i < n))
        for i in range(max(counts))
    ]
    with bench.toolexec_workers(workers, bench.options.pool, 1):
        tools = {n: bench.tool(names.scale_tool(n)) for n in counts}
        sides = [
            (str(n), functools.partial(_block, bench, tools[n], n, bench.sizes.scale_calls * n))
            for n in counts
        ]
        _block(bench, tools[max(counts)], max(counts), max(counts))  # warm every worker up
        results = alternate(sides, bench.sizes.scale_rounds)
    rates = {
        int(n): bench.sizes.scale_calls * int(n) * len(times) / sum(times)
        for n, times in results.items()
    }
    one = rates[counts[0]]
    rows = [
        (str(n), rate(r), rate(n * 1000 / _TOOL_MS), ratio(r / one), f"{r / (n * one):.0%}")
        for n, r in rates.items()
    ]
    most = counts[-1]
    efficiency = rates[most] / (most * one)
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=("worker processes", "calls/s", "ideal calls/s", "speed-up", "efficiency"),
                rows=rows,
            )
        ],
        goals=[
            Goal(
                name=f"efficiency at {most} processes",
                measured=f"{efficiency:.0%}",
                target="≥ 90% (near-linear)",
                met=efficiency >= 0.9,
            )
        ],
        notes=[
            (
                f"{bench.options.pool} pool, one process per worker; {_LANES} calls in flight "
                "per process."
            ),
            (
                f"{bench.sizes.scale_rounds} alternated rounds of {bench.sizes.scale_calls} calls "
                "per process."
            ),
        ],
    )


def _block(bench: Bench, tool: RemoteTool, processes: int, total: int) -> float:
    return bench.run(
        keep_in_flight(
            lambda: tool.invoke({"ms": _TOOL_MS}, timeout=_TIMEOUT), _LANES * processes, total
        )
    )
