"""14. The asyncio pool reads its queues on its own loop: ``TOOLEXEC_LOOP_READS`` on and off.

With a Redis broker the asyncio pool's event loop reads its queues itself
(:mod:`executor.pools.reads`): a call reaches the loop without crossing from Celery's
consumer thread, and its acknowledgement is made where it is asked instead of being handed
back to that thread. ``TOOLEXEC_LOOP_READS=false`` leaves the reading to Celery's consumer,
as every other pool does. Two asyncio workers (``-c`` as in scenario 2), one each way, each
on a queue and no-op of its own; blocks alternate between them: sequential calls (their
p50 and p99), then calls kept in flight (calls/s).

CPU per call: the side's worker, all of it (main process; its background included), over
its in-flight blocks; Redis commands per call over those blocks, less the rate with no
calls (``INFO commandstats``, :mod:`bench.peers.usage`). The ratios divide the side that
reads on the loop by the side whose consumer reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bench import names
from bench.harness import PROJECT_ROOT, Bench
from bench.peers.usage import Reading, Usage, idle_usage
from bench.report import Goal, ScenarioResult, Table, ms, rate, ratio
from bench.stats import Latencies, alternate, keep_in_flight, timed_async
from toolexec import WorkerProcess

NUMBER = 14
TITLE = "The asyncio pool's loop reads its queues: TOOLEXEC_LOOP_READS on and off"

_TIMEOUT = 120.0
_WARMUP = 50
#: How each value of TOOLEXEC_LOOP_READS reads in the tables.
_LABEL = {"true": "on: the loop reads", "false": "off: Celery's consumer reads"}


def run(bench: Bench) -> ScenarioResult:
    """Sequential p50/p99, calls/s and CPU per call, with the loop reading and without."""
    concurrency = bench.sizes.throughput_pool_concurrency
    built = [
        WorkerProcess(
            name=f"reads-{mode}",
            pool="asyncio",
            concurrency=concurrency,
            queues=[names.reads_queue(mode)],
            env={**bench.env, "TOOLEXEC_LOOP_READS": mode},
            cwd=PROJECT_ROOT,
            log_dir=bench.logs,
        )
        for mode in names.LOOP_READS
    ]
    with bench.launched(built) as workers:
        pids = dict(zip(names.LOOP_READS, (w.pid for w in workers), strict=True))
        return _measure(bench, pids, concurrency)


def _measure(bench: Bench, pids: dict[str, int | None], concurrency: int) -> ScenarioResult:
    sizes = bench.sizes
    in_flight, total, sequential = sizes.events_in_flight, sizes.events_calls, sizes.roundtrip_calls
    calls = {mode: _caller(bench, mode) for mode in pids}
    for call in calls.values():  # connections open, scripts loaded
        bench.run(keep_in_flight(call, min(in_flight, _WARMUP), _WARMUP))
    idle = {mode: idle_usage(bench.redis, bench.server.pid, pid) for mode, pid in pids.items()}
    usage = {mode: Usage() for mode in pids}
    latencies: dict[str, list[list[float]]] = {mode: [] for mode in pids}

    def block(mode: str) -> Callable[[], None]:
        def measured() -> None:
            latencies[mode].append(bench.run(timed_async(calls[mode], sequential)))
            before = Reading.take(bench.redis, bench.server.pid, pids[mode])
            elapsed = bench.run(keep_in_flight(calls[mode], in_flight, total))
            after = Reading.take(bench.redis, bench.server.pid, pids[mode])
            usage[mode].add(before, after, seconds=elapsed, calls=total)

        return measured

    alternate([(mode, block(mode)) for mode in pids], sizes.events_rounds)
    net = {mode: usage[mode].net(idle[mode]) for mode in pids}
    seen = {mode: Latencies.of(latencies[mode]) for mode in pids}
    rows = [
        (
            _LABEL[mode],
            ms(seen[mode].p50),
            ms(seen[mode].p99),
            rate(net[mode].rate),
            f"{net[mode].per_call(net[mode].main + net[mode].children) * 1e6:.0f}",
            f"{net[mode].per_call(net[mode].commands):.2f}",
        )
        for mode in pids
    ]
    on, off = net["true"], net["false"]
    p50 = seen["true"].p50 / seen["false"].p50
    faster = on.rate / off.rate
    leaner = on.per_call(on.main + on.children) / off.per_call(off.main + off.children)
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=(
                    f"asyncio -c {concurrency}",
                    "sequential p50 ms",
                    "sequential p99 ms",
                    f"calls/s, {in_flight} in flight",
                    "worker CPU µs/call",
                    "Redis commands/call",
                ),
                rows=rows,
            )
        ],
        goals=[
            Goal(
                name="loop reads / consumer reads, sequential p50",
                measured=ratio(p50),
                target="information",
                met=None,
            ),
            Goal(
                name=f"loop reads / consumer reads, calls/s at {in_flight} in flight",
                measured=ratio(faster),
                target="information",
                met=None,
            ),
            Goal(
                name=f"loop reads / consumer reads, worker CPU per call at {in_flight} in flight",
                measured=ratio(leaner),
                target="information",
                met=None,
            ),
        ],
        notes=[
            (
                f"{sizes.events_rounds} alternated rounds per side: {sequential} sequential no-op "
                f"calls, then {total:,} with {in_flight} in flight from one client process; "
                "calls/s is all in-flight calls over all their block time."
            ),
            (
                "Worker CPU: user + system time of the worker process over the in-flight "
                "blocks, its background included, per call. Redis commands: INFO "
                "commandstats around each in-flight block, less the rate over 1 s with no "
                "calls, commands inside scripts counted."
            ),
        ],
    )


def _caller(bench: Bench, mode: str) -> Callable[[], Awaitable[object]]:
    tool = bench.tool(names.reads_tool(mode))
    return lambda: tool.invoke({}, timeout=_TIMEOUT)
