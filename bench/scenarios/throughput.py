"""2. Throughput from one client process with 1, 10, 100 and 1,000 calls in flight.

toolexec keeps N calls in flight with asyncio (N coroutines, each calling again as soon
as its call returns). Plain Celery gets its best single-thread pattern (send N, then
``.get()`` each, repeat) and the thread pattern (N threads, each ``send_task().get()``
in a loop), each against two plain Celery workers on the same pool and concurrency:
one with Celery's default prefetch (multiplier 4) and one with prefetch multiplier 1
(``--prefetch-multiplier 1``, as toolexec's workers run). Every block calls the no-op
tool; the sides alternate at each level. The goal compares toolexec, at each level,
with the fastest of the four raw Celery sides at that level, and the table names it.

toolexec is measured on the shared workers' pool, against raw Celery on the same pool
and concurrency, and on a second pool (``Sizes.throughput_pool``: the asyncio pool) by a
worker of its own; each line of the figure is one side on one pool. Over RabbitMQ
(``--broker amqp``) only the shared pool is measured.

Beside the rates: the CPU time each side's worker (its main process and pool children,
from the OS: :mod:`bench.cpu`) used per call, net of what it uses idle (heartbeats,
timers) over the same time; and, at the highest level, where each side's time went:
how busy the worker's main process, its pool children, the calling process and the
Redis server were over that side's blocks, and their CPU per call. A side none of whose
processes is near a whole core is bound by the waits between them, not by one of them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from agent_client import RemoteTool
from bench import names, raw_celery
from bench.cpu import CpuSplit, cpu_seconds, cpu_split, own_cpu
from bench.harness import Bench
from bench.report import Figure, Goal, ScenarioResult, Table, rate, ratio
from bench.stats import alternate, keep_in_flight

NUMBER = 2
TITLE = "Throughput with 1, 10, 100 and 1,000 calls in flight"

_TIMEOUT = 120.0
_TOOLEXEC = "toolexec"
_RAW_BEST = "raw Celery send all, then .get() each"
_RAW_THREADS = "raw Celery threads calling .get()"
#: The columns of the table of where each side's time went (:func:`_usage_row`).
USAGE_COLUMNS = (
    "side (highest level)",
    "worker main process: busy · CPU/call",
    "pool children",
    "client process",
    "Redis server",
)
#: Celery's default prefetch multiplier, which the shared raw Celery worker keeps.
_CELERY_DEFAULT_PREFETCH = 4


@dataclass(frozen=True, kw_only=True)
class _Side:
    """One column: who calls, on which worker, and how a block of calls is made."""

    label: str
    pid: int | None
    #: ``block(in_flight, total)``: the seconds ``total`` calls took.
    block: Callable[[int, int], float]
    raw: bool = False


def run(bench: Bench) -> ScenarioResult:
    """Calls per second of each side at each level, from alternated blocks."""
    second = bench.sizes.throughput_pool
    if second == bench.options.pool or bench.options.broker == "amqp":
        # Over RabbitMQ the run's queues are its own (bench.amqp): only the shared pool's.
        second = None
    with contextlib.ExitStack() as stack:
        prefetch1 = stack.enter_context(
            bench.raw_worker(
                "raw-prefetch1",
                bench.options.pool,
                bench.options.concurrency,
                bench.raw_prefetch1_queue,
                prefetch_multiplier=1,
            )
        )
        if second is None:
            return _measure(bench, None, prefetch1.pid)
        concurrency = bench.sizes.throughput_pool_concurrency
        (worker,) = stack.enter_context(
            bench.toolexec_workers([(f"pool-{second}", (names.POOL_QUEUE,))], second, concurrency)
        )
        return _measure(bench, (f"{second} -c {concurrency}", worker.pid), prefetch1.pid)


def _measure(
    bench: Bench, second: tuple[str, int | None] | None, prefetch1_pid: int | None
) -> ScenarioResult:
    pool = f"{bench.options.pool} -c {bench.options.concurrency}"
    toolexec_pid = bench.shared_toolexec.pid if bench.shared_toolexec else None
    raw_pid = bench.shared_raw.pid if bench.shared_raw else None
    noop = bench.tool("noop")
    default, one = bench.raw_queue, bench.raw_prefetch1_queue
    sides = [
        _Side(
            label=f"{_TOOLEXEC} ({pool})",
            pid=toolexec_pid,
            block=functools.partial(_toolexec, bench, noop),
        ),
        *(
            _Side(
                label=f"{pattern} ({pool}, prefetch ×{multiplier})",
                pid=pid,
                block=functools.partial(make, bench, queue),
                raw=True,
            )
            for multiplier, queue, pid in (
                (_CELERY_DEFAULT_PREFETCH, default, raw_pid),
                (1, one, prefetch1_pid),
            )
            for pattern, make in (
                (_RAW_BEST, _raw_send_all_then_get),
                (_RAW_THREADS, _raw_threads),
            )
        ),
    ]
    if second is not None:
        other = bench.tool("noop_pool")
        sides.append(
            _Side(
                label=f"{_TOOLEXEC} ({second[0]})",
                pid=second[1],
                block=functools.partial(_toolexec, bench, other),
            )
        )
    labels = [side.label for side in sides]
    raw_labels = [side.label for side in sides if side.raw]
    idle = {side.label: _idle_cpu(side.pid) for side in sides}
    rows, cpu_rows = [], []
    usage_rows: list[tuple[str, ...]] = []
    redis_pid = bench.server.pid
    series: dict[str, list[tuple[float | str, float]]] = defaultdict(list)
    best_ratio, level = float("nan"), 0
    toolexec = labels[0]
    for in_flight in bench.sizes.in_flight:
        total = bench.sizes.throughput_block(in_flight)
        cpu: dict[str, float] = defaultdict(float)
        usage = {label: _Usage() for label in labels}
        blocks = [
            (
                side.label,
                _with_cpu(
                    functools.partial(side.block, in_flight, total),
                    side.pid,
                    idle[side.label],
                    cpu,
                    side.label,
                    usage[side.label],
                    redis_pid,
                ),
            )
            for side in sides
        ]
        elapsed = alternate(blocks, bench.sizes.throughput_rounds)
        rates = {label: total * len(times) / sum(times) for label, times in elapsed.items()}
        # The fastest raw Celery side at this level, whichever pattern and prefetch it is.
        raw_best = max(raw_labels, key=lambda label: rates[label])
        best_ratio, level = rates[toolexec] / rates[raw_best], in_flight
        for label in labels:
            series[label].append((in_flight, rates[label]))
        rows.append(
            (
                f"{in_flight:,}",
                f"{total:,}",
                *(rate(rates[label]) for label in labels),
                _short(raw_best),
                ratio(best_ratio),
            )
        )
        calls = total * bench.sizes.throughput_rounds
        per_call = {label: cpu[label] / calls for label in labels}
        raw_least = min(raw_labels, key=lambda label: per_call[label])
        cpu_ratio = (
            per_call[toolexec] / per_call[raw_least] if per_call[raw_least] > 0 else float("nan")
        )
        cpu_rows.append(
            (
                f"{in_flight:,}",
                *(f"{per_call[label] * 1000:.3f}" for label in labels),
                _short(raw_least),
                ratio(cpu_ratio),
            )
        )
        # Overwritten at each level: the table shows the highest.
        usage_rows = [_usage_row(label, usage[label], calls) for label in labels]
    columns = (
        "in flight",
        "calls per block",
        *(f"{label} calls/s" for label in labels),
        "fastest raw Celery side",
        "toolexec / fastest raw",
    )
    goal = Goal(
        name=(
            f"toolexec / fastest raw Celery side (either pattern, either prefetch) at "
            f"{level:,} in flight, {pool}"
        ),
        measured=ratio(best_ratio),
        target="≥ 3.00× at 1,000",
        met=(best_ratio >= 3.0) if level == 1000 else None,
    )
    cpu_columns = (
        "in flight",
        *(f"{label} worker CPU ms/call" for label in labels),
        "leanest raw Celery side",
        "toolexec / leanest raw",
    )
    idle_text = ", ".join(f"{label} {idle[label] * 1000:.1f} ms/s" for label in labels)
    notes = [
        (
            f"{bench.sizes.throughput_rounds} alternated blocks per side and level; calls/s is all "
            "calls over all block time."
        ),
        (
            "Raw Celery runs two workers on the same pool and concurrency: Celery's default "
            f"prefetch (multiplier {_CELERY_DEFAULT_PREFETCH}) and `--prefetch-multiplier 1`; "
            "each serves both client patterns. The ratio compares toolexec with the fastest "
            "of the four raw sides at each level; the next column names it."
        ),
        (
            "Worker CPU: user + system time of the side's worker (main process and pool children) "
            "over each block, less its idle rate over the same time, divided by the calls; "
            f"idle: {idle_text}. The CPU ratio compares toolexec with the raw side that used the "
            "least CPU per call at that level."
        ),
    ]
    notes.append(
        f"Where the time went, at {level:,} in flight: each process's CPU over the side's "
        "blocks as a share of one core (the machine has "
        f'{os.cpu_count() or "?"}), and per call. "client" is this benchmark\'s own process, '
        'all its threads; "Redis" is the private server all sides share. A side with no '
        "process near 100% is bound by the hand-offs between its processes."
    )
    if second is not None:
        notes.append(
            f"toolexec ({second[0]}) is a second toolexec worker on that pool, calling the same "
            "no-op on a queue of its own; the goal compares the sides on the same pool."
        )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(columns=columns, rows=rows),
            Table(columns=cpu_columns, rows=cpu_rows),
            Table(columns=USAGE_COLUMNS, rows=usage_rows),
        ],
        goals=[goal],
        notes=notes,
        figures=[
            Figure(
                name="throughput",
                title="No-op throughput from one client process, by side and worker pool",
                kind="lines",
                x_label="calls in flight",
                y_label="calls per second",
                series=dict(series),
            )
        ],
    )


def _short(label: str) -> str:
    """A raw side's label without its pool: ``pattern, prefetch ×N``."""
    pattern, _, rest = label.partition(" (")
    return f"{pattern}, {rest.rstrip(')').rpartition(', ')[2]}"


@dataclass
class _Usage:
    """Where one side's time went over its blocks at one level (CPU and wall seconds)."""

    main: float = 0.0
    children: float = 0.0
    client: float = 0.0
    redis: float = 0.0
    seconds: float = 0.0


def _with_cpu(
    block: Callable[[], float],
    pid: int | None,
    idle: float,
    cpu: dict[str, float],
    name: str,
    usage: _Usage,
    redis_pid: int | None,
) -> Callable[[], float]:
    """``block``, adding the CPU seconds the worker ``pid`` spent on it to ``cpu[name]``,
    and each process's CPU seconds over it (worker split, this process, Redis) to ``usage``."""

    def measured() -> float:
        before, client, server = cpu_split(pid), time.process_time(), _own(redis_pid)
        elapsed = block()
        spent: CpuSplit = cpu_split(pid) - before
        cpu[name] += max(0.0, spent.total - idle * elapsed)
        usage.main += spent.main
        usage.children += spent.children
        usage.client += time.process_time() - client
        usage.redis += _own(redis_pid) - server
        usage.seconds += elapsed
        return elapsed

    return measured


def _own(pid: int | None) -> float:
    return 0.0 if pid is None else own_cpu(pid)


def _usage_row(label: str, usage: _Usage, calls: int) -> tuple[str, ...]:
    """One side's cells: each process's share of a core over its blocks, and µs per call."""

    def cell(seconds: float) -> str:
        share = seconds / usage.seconds if usage.seconds > 0 else float("nan")
        return f"{share:.0%} · {seconds / calls * 1e6:.0f} µs"

    return (label, cell(usage.main), cell(usage.children), cell(usage.client), cell(usage.redis))


def _idle_cpu(pid: int | None, seconds: float = 1.0) -> float:
    """CPU seconds per second the worker ``pid`` uses with no calls (heartbeats, timers)."""
    before, start = cpu_seconds(pid), time.perf_counter()
    time.sleep(seconds)
    return max(0.0, cpu_seconds(pid) - before) / (time.perf_counter() - start)


def _toolexec(bench: Bench, tool: RemoteTool, in_flight: int, total: int) -> float:
    return bench.run(keep_in_flight(lambda: tool.invoke({}, timeout=_TIMEOUT), in_flight, total))


def _raw_send_all_then_get(bench: Bench, queue: str, in_flight: int, total: int) -> float:
    start = time.perf_counter()
    done = 0
    while done < total:
        batch = min(in_flight, total - done)
        results = [bench.celery.send_task(raw_celery.NOOP, queue=queue) for _ in range(batch)]
        for result in results:
            result.get(timeout=_TIMEOUT)
        done += batch
    return time.perf_counter() - start


def _raw_threads(bench: Bench, queue: str, in_flight: int, total: int) -> float:
    tickets = itertools.count()  # next() on a count is atomic under the GIL
    errors: list[BaseException] = []

    def lane() -> None:
        try:
            while next(tickets) < total:
                bench.celery.send_task(raw_celery.NOOP, queue=queue).get(timeout=_TIMEOUT)
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
