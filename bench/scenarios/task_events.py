"""12. Task events on and off: calls/s and worker CPU per call at 100 calls in flight.

Celery's task events (``task-received``, ``task-started``, ``task-succeeded``: what
Flower shows) are sent by the worker's main process, one ``PUBLISH`` each, whether
anyone listens or not. ``TOOLEXEC_TASK_EVENTS`` decides when a worker sends them
(:mod:`executor.seams.events`): ``on`` from the start (as ``-E``), ``auto`` (the default)
only once a monitor asks, so with no monitor none. Each pool is measured both ways on
workers started as ``toolexec worker`` starts them (its command line,
:func:`toolexec.commands.worker.worker_argv`, so Celery's worker heartbeat and its event
dispatcher are on either way), four workers side by side, each on a queue and no-op of
its own: the asyncio pool with ``-c`` as in scenario 2, prefork with the shared workers'
concurrency. Blocks alternate over the four; each side keeps the same number of calls
in flight from this process.

Beside calls/s: the CPU time of the side's worker per call (main process and pool
children, less their idle rate), its main process alone, the Redis server's (less its
idle rate), and the ``PUBLISH`` commands per call the server ran (``INFO commandstats``):
Celery's worker buffers task events and publishes them a batch at a time (one
``task.multi`` message), so fewer than the three events a call has, but none at all when
the worker sends none. The ratios divide the side with events off
by the side with events on.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from bench import names
from bench.cpu import CpuSplit, cpu_split, own_cpu
from bench.harness import PROJECT_ROOT, Bench
from bench.report import ScenarioResult, Table, rate, ratio
from bench.stats import alternate, keep_in_flight
from toolexec import Pool, WorkerProcess
from toolexec.commands.worker import worker_argv

NUMBER = 12
TITLE = "Task events on and off, at 100 calls in flight"

_TIMEOUT = 120.0
_WARMUP = 50
#: How each value of TOOLEXEC_TASK_EVENTS reads in the tables.
_MODE = {"on": "on", "auto": "off (auto, no monitor)"}


class _CommandWorker(WorkerProcess):
    """A worker with the command line ``toolexec worker`` runs (no ``--without-heartbeat``)."""

    def argv(self) -> list[str]:
        """:func:`worker_argv` for this worker's pool, concurrency, queues and name."""
        return worker_argv(
            pool=self.pool,
            concurrency=self.concurrency,
            queues=self.queues,
            name=f"{self.name}@%h",
            loglevel=self.loglevel,
        )


@dataclass(frozen=True, kw_only=True)
class _Side:
    pool: Pool
    events: str
    concurrency: int
    worker: WorkerProcess

    @property
    def label(self) -> str:
        return f"{self.pool} -c {self.concurrency}, events {_MODE[self.events]}"


@dataclass
class _Usage:
    """What one side's blocks cost, summed over its rounds."""

    seconds: float = 0.0
    calls: int = 0
    worker: float = 0.0
    main: float = 0.0
    redis: float = 0.0
    publishes: int = 0


def run(bench: Bench) -> ScenarioResult:
    """Calls/s and CPU per call of each pool with task events on and off."""
    built = []
    for pool, events in names.EVENTS_WORKERS:
        concurrency = (
            bench.sizes.throughput_pool_concurrency
            if pool == "asyncio"
            else bench.options.concurrency
        )
        worker = _CommandWorker(
            name=f"events-{pool}-{events}",
            pool=pool,
            concurrency=concurrency,
            queues=[names.events_queue(pool, events)],
            env={**bench.env, "TOOLEXEC_TASK_EVENTS": events},
            cwd=PROJECT_ROOT,
            log_dir=bench.logs,
        )
        built.append(worker)
    with bench.launched(built) as workers:
        sides = [
            _Side(pool=w.pool, events=events, concurrency=w.concurrency, worker=w)
            for w, (_, events) in zip(workers, names.EVENTS_WORKERS, strict=True)
        ]
        return _measure(bench, sides)


def _measure(bench: Bench, sides: Sequence[_Side]) -> ScenarioResult:
    in_flight, total = bench.sizes.events_in_flight, bench.sizes.events_calls
    for side in sides:  # pool children forked, scripts loaded, connections open
        bench.run(keep_in_flight(_caller(bench, side), min(in_flight, _WARMUP), _WARMUP))
    idle = _idle_rates(bench, sides)
    usage = {side.label: _Usage() for side in sides}
    blocks = [
        (side.label, _block(bench, side, in_flight, total, idle, usage[side.label]))
        for side in sides
    ]
    alternate(blocks, bench.sizes.events_rounds)
    rows = []
    for side in sides:
        u = usage[side.label]
        rows.append(
            (
                side.pool,
                _MODE[side.events],
                f"-c {side.concurrency}",
                rate(u.calls / u.seconds),
                _micros(u.worker, u.calls),
                _micros(u.main, u.calls),
                _micros(u.redis, u.calls),
                f"{u.publishes / u.calls:.2f}",
            )
        )
    ratios = []
    for pool in dict.fromkeys(side.pool for side in sides):
        on, off = (
            usage[s.label]
            for e in ("on", "auto")
            for s in sides
            if s.pool == pool and s.events == e
        )
        ratios.append(
            (
                pool,
                ratio((off.calls / off.seconds) / (on.calls / on.seconds)),
                ratio((off.worker / off.calls) / (on.worker / on.calls)),
                ratio((off.main / off.calls) / (on.main / on.calls)),
            )
        )
    idle_text = ", ".join(
        f"{side.label} {idle[side.label].total * 1000:.1f} ms/s" for side in sides
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=(
                    "pool",
                    "task events",
                    "concurrency",
                    "calls/s",
                    "worker CPU µs/call",
                    "main process µs/call",
                    "Redis CPU µs/call",
                    "PUBLISH/call",
                ),
                rows=rows,
            ),
            Table(
                columns=(
                    "pool",
                    "calls/s: off / on",
                    "worker CPU per call: off / on",
                    "main process CPU per call: off / on",
                ),
                rows=ratios,
            ),
        ],
        notes=[
            (
                f"{bench.sizes.events_rounds} alternated blocks of {total:,} no-op calls per side, "
                f"{in_flight} in flight from one client process; calls/s is all calls over all "
                "block time."
            ),
            (
                "`on` is `TOOLEXEC_TASK_EVENTS=on` (as `-E`); `off` is the default, `auto`, with "
                "no monitor running. A monitor's `enable_events` (Flower's, every 5 s) makes an "
                "`auto` worker cost what `on` costs."
            ),
            (
                "Worker CPU: user + system time of the worker's main process and pool children "
                "over each block, less its idle rate over the same time, per call; Redis CPU "
                f"likewise (the server all sides share). Idle: {idle_text}, Redis "
                f"{idle['redis'].total * 1000:.1f} ms/s. PUBLISH/call counts every PUBLISH the "
                "server ran over the side's blocks, the workers' heartbeat events (every 2 s each) "
                "included; the worker publishes its task events in batches (`task.multi`), several "
                "to a PUBLISH."
            ),
        ],
    )


def _caller(bench: Bench, side: _Side) -> Callable[[], Awaitable[object]]:
    tool = bench.tool(names.events_tool(side.pool, side.events))
    return lambda: tool.invoke({}, timeout=_TIMEOUT)


def _block(
    bench: Bench, side: _Side, in_flight: int, total: int, idle: dict[str, CpuSplit], usage: _Usage
) -> Callable[[], float]:
    call = _caller(bench, side)
    pid, server = side.worker.pid, bench.server.pid

    def measured() -> float:
        split, redis, publishes = cpu_split(pid), _own(server), _publishes(bench)
        elapsed = bench.run(keep_in_flight(call, in_flight, total))
        spent = cpu_split(pid) - split
        usage.seconds += elapsed
        usage.calls += total
        usage.worker += max(0.0, spent.total - idle[side.label].total * elapsed)
        usage.main += max(0.0, spent.main - idle[side.label].main * elapsed)
        usage.redis += max(0.0, _own(server) - redis - idle["redis"].total * elapsed)
        usage.publishes += _publishes(bench) - publishes
        return elapsed

    return measured


def _idle_rates(bench: Bench, sides: Sequence[_Side], seconds: float = 1.0) -> dict[str, CpuSplit]:
    """CPU seconds per second of each side's worker (main process, children), and of
    Redis (``"redis"``), with no calls."""
    before = {side.label: cpu_split(side.worker.pid) for side in sides}
    redis, start = _own(bench.server.pid), time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - start
    rates = {}
    for side in sides:
        spent = cpu_split(side.worker.pid) - before[side.label]
        rates[side.label] = CpuSplit(
            max(0.0, spent.main) / elapsed, max(0.0, spent.children) / elapsed
        )
    rates["redis"] = CpuSplit(max(0.0, _own(bench.server.pid) - redis) / elapsed)
    return rates


def _publishes(bench: Bench) -> int:
    stats = bench.redis.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


def _own(pid: int | None) -> float:
    return 0.0 if pid is None else own_cpu(pid)


def _micros(seconds: float, calls: int) -> str:
    return f"{seconds / calls * 1e6:.0f}" if calls else "–"
