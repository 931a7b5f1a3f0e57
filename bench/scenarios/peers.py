"""11. The peers: Dramatiq, arq and taskiq beside toolexec and raw Celery, on one Redis.

Every side calls the same no-op from this one client process and waits for its
result, against workers of its own on the benchmark's private Redis: toolexec on the
shared pool and on the asyncio pool, plain Celery on the shared pool, Dramatiq (Redis
broker, Results middleware), arq, taskiq with taskiq-redis (bench/peers/), and the
hand-written RPC floor. Each peer runs with the settings its documentation gives,
lowered where a default is a poll meant for background jobs (arq's ``poll_delay``,
arq's and taskiq's result polls); the output states every side's worker processes,
concurrency and client.

The sides alternate in blocks (A B C ... A B C ...): first one call at a time (p50 and
p99), then at each level of calls in flight. Around every block the CPU time of the
side's worker (main process and children apart), of this process and of the Redis
server is read, and the server's command count; for the processes every side shares
(this one, Redis) and for the commands, what they spend with no calls, read over an
idle window with every side running, is taken away (bench/peers/usage.py). The issue's
goals are checked at 100 and 1,000 in flight: toolexec's best pool against the fastest
and the leanest peer, and against the floor; and one call at a time, each toolexec
pool against raw Celery.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from bench import names, raw_celery
from bench.harness import Bench
from bench.peers.calls import Calls, Side, async_calls, sync_calls
from bench.peers.launch import peers
from bench.peers.tables import (
    commands_table,
    cpu_table,
    goals,
    rate_table,
    roles_table,
    sequential_table,
)
from bench.peers.usage import Reading, Usage
from bench.redis_rpc import AsyncRpcClient
from bench.report import ScenarioResult, Table
from bench.stats import Latencies, alternate, timed

NUMBER = 11
TITLE = "Peers: Dramatiq, arq and taskiq beside toolexec and raw Celery"

_TIMEOUT = 120.0
#: Seconds of the idle window (every side running, no calls).
_IDLE = 1.0
#: Untimed calls of a side just before each of its blocks.
_PRELUDE = 2
_FLOOR = "Redis RPC floor"


def run(bench: Bench) -> ScenarioResult:
    """Start the peers and the second toolexec pool, measure every side, check the goals."""
    with contextlib.ExitStack() as stack:
        sides = [*stack.enter_context(_own_sides(bench)), *stack.enter_context(peers(bench))]
        floor = AsyncRpcClient(bench.url)
        stack.callback(lambda: bench.run(floor.aclose()))
        sides.append(
            Side(
                label=_FLOOR,
                kind="floor",
                worker="bench.redis_rpc: one process, BRPOP a request, LPUSH its reply",
                client=(
                    "LPUSH + BRPOP one at a time; with N in flight N coroutines, LPUSH "
                    "each, one reader BLMPOPs the replies"
                ),
                pid=None if bench.rpc_server is None else bench.rpc_server.pid,
                calls=Calls(
                    sequential=lambda n: timed(lambda: bench.rpc.call(timeout=_TIMEOUT), n),
                    block=async_calls(bench.run, lambda _: lambda: floor.call(_TIMEOUT)).block,
                ),
            )
        )
        return _measure(bench, sides)


@contextlib.contextmanager
def _own_sides(bench: Bench) -> Iterator[list[Side]]:
    """toolexec on the shared pool and on the asyncio pool, raw Celery on the shared pool."""
    shared = f"{bench.options.pool} -c {bench.options.concurrency}"
    noop = bench.tool("noop")
    sides = [
        Side(
            label=f"toolexec ({shared})",
            kind="toolexec",
            worker=f"the shared toolexec worker, {shared}",
            client="`await tool.invoke()`; N coroutines",
            pid=bench.shared_toolexec.pid if bench.shared_toolexec else None,
            calls=async_calls(bench.run, lambda _: lambda: noop.invoke({}, timeout=_TIMEOUT)),
        ),
        Side(
            label=f"raw Celery ({shared})",
            kind="raw",
            worker=f"the shared plain Celery worker, {shared}, Celery's defaults (prefetch ×4)",
            client="`send_task()`; a window of N in one thread; `.get()` (Redis result backend)",
            pid=bench.shared_raw.pid if bench.shared_raw else None,
            calls=sync_calls(
                lambda: bench.celery.send_task(raw_celery.NOOP, queue=bench.raw_queue),
                lambda result: result.get(timeout=_TIMEOUT),
            ),
        ),
    ]
    second, concurrency = bench.sizes.throughput_pool, bench.sizes.throughput_pool_concurrency
    if second is None or second == bench.options.pool:
        yield sides
        return
    with bench.toolexec_workers(
        [(f"peers-{second}", (names.POOL_QUEUE,))], second, concurrency
    ) as (worker,):
        other = bench.tool("noop_pool")  # once its worker serves it
        sides.insert(
            1,
            Side(
                label=f"toolexec ({second} -c {concurrency})",
                kind="toolexec",
                worker=f"a toolexec worker of its own, {second} -c {concurrency}",
                client="`await tool.invoke()`; N coroutines",
                pid=worker.pid,
                calls=async_calls(bench.run, lambda _: lambda: other.invoke({}, timeout=_TIMEOUT)),
            ),
        )
        yield sides


def _measure(bench: Bench, sides: Sequence[Side]) -> ScenarioResult:
    sizes = bench.sizes
    labels = [side.label for side in sides]
    kinds = {side.label: side.kind for side in sides}
    for side in sides:  # warm: connections open, scripts loaded, pool children forked
        side.calls.sequential(sizes.warmup)
    idle = _idle(bench, sides)
    sequential = alternate(
        [(side.label, functools.partial(_sequential, side, sizes.peer_calls)) for side in sides],
        sizes.peer_rounds,
    )
    latencies = {label: Latencies.of(blocks) for label, blocks in sequential.items()}
    usage: dict[int, dict[str, Usage]] = {}
    for in_flight in sizes.peer_in_flight:
        total = sizes.peer_block(in_flight)
        level = {side.label: Usage() for side in sides}
        alternate(
            [
                (side.label, _block(bench, side, in_flight, total, level[side.label]))
                for side in sides
            ],
            sizes.peer_rounds,
        )
        usage[in_flight] = {label: level[label].net(idle[label]) for label in labels}
    rates = {n: {label: u.rate for label, u in by.items()} for n, by in usage.items()}
    cpu = {n: {label: u.per_call(u.cpu) for label, u in by.items()} for n, by in usage.items()}
    p50 = {label: lat.p50 for label, lat in latencies.items()}
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=("side", "worker processes and settings", "client"),
                rows=[(side.label, side.worker, side.client) for side in sides],
            ),
            sequential_table(latencies, kinds),
            rate_table(sizes.peer_block, rates, kinds),
            cpu_table(cpu, kinds),
            roles_table(usage),
            commands_table(usage, labels),
        ],
        goals=goals(kinds=kinds, p50=p50, rates=rates, cpu=cpu),
        notes=_notes(bench, idle),
    )


def _sequential(side: Side, n: int) -> list[float]:
    side.calls.sequential(_PRELUDE)
    return side.calls.sequential(n)


def _block(
    bench: Bench, side: Side, in_flight: int, total: int, usage: Usage
) -> Callable[[], float]:
    server_pid = bench.server.pid

    def measured() -> float:
        side.calls.sequential(_PRELUDE)
        before = Reading.take(bench.redis, server_pid, side.pid)
        seconds = side.calls.block(in_flight, total)
        usage.add(
            before, Reading.take(bench.redis, server_pid, side.pid), seconds=seconds, calls=total
        )
        return seconds

    return measured


def _idle(bench: Bench, sides: Sequence[Side]) -> dict[str, Usage]:
    """What each side's processes (and this one, and Redis) spend over a window of no calls."""
    before = {side.label: Reading.take(bench.redis, bench.server.pid, side.pid) for side in sides}
    start = time.perf_counter()
    time.sleep(_IDLE)
    seconds = time.perf_counter() - start
    idle = {}
    for side in sides:
        usage = Usage()
        after = Reading.take(bench.redis, bench.server.pid, side.pid)
        usage.add(before[side.label], after, seconds=seconds, calls=0)
        idle[side.label] = usage
    return idle


def _notes(bench: Bench, idle: Mapping[str, Usage]) -> list[str]:
    sizes = bench.sizes
    any_idle = next(iter(idle.values()))
    idle_text = ", ".join(
        f"{label} {(u.main + u.children) / u.seconds * 1000:.1f} ms/s" for label, u in idle.items()
    )
    return [
        (
            f"One call at a time: {sizes.peer_rounds} alternated rounds of {sizes.peer_calls} "
            f"calls per side, after {sizes.warmup} warm-up calls each. In flight: "
            f"{sizes.peer_rounds} alternated blocks per side and level; calls/s is all calls "
            f"over all block time. Every block starts after {_PRELUDE} untimed calls of its "
            "side, so that no worker starts it asleep (an idle Dramatiq consumer backs off "
            "up to 1 s between fetches)."
        ),
        (
            "CPU per call: user + system time over the side's blocks, divided by the calls, "
            "of the side's worker (main process and its direct children), all of it, its "
            "background included; and of the processes every side shares, this one (the "
            "client, all its threads) and the Redis server, less their rate over a "
            f"{_IDLE:g} s idle window with every side running: "
            f"{any_idle.client / any_idle.seconds * 1000:.1f} ms/s and "
            f"{any_idle.redis / any_idle.seconds * 1000:.1f} ms/s. The workers idle, for "
            f"comparison: {idle_text}. The OS counts CPU time in ticks of 10 ms: a block "
            "of few calls reads it coarsely."
        ),
        (
            "Redis commands per call: `INFO commandstats` before and after each block, less "
            f"the background ({any_idle.commands / any_idle.seconds:.0f} commands/s with no "
            "calls: heartbeats, the workers' polls, arq's above all, which arq's own count "
            "leaves out too), commands inside Lua scripts counted."
        ),
        (
            "Goals: toolexec's best pool is, for calls/s, its fastest side at that level and, "
            "for CPU, its leanest; the peers are Dramatiq, arq and taskiq; the floor is the "
            "hand-written RPC (its CPU: server, client and Redis alike)."
        ),
    ]
