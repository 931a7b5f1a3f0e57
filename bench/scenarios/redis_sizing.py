"""15. Redis CPU per call: how many calls a second one Redis core serves.

Redis runs commands on one thread, so the CPU it spends per call bounds what one server
serves: about one second of CPU per second, a core. The scenario keeps calls in flight
through an asyncio worker of its own (``-c`` as in scenario 2, on a queue of its own) and
reads, around each block, the Redis server's CPU time (user + system, less its rate with
no calls) and the commands it ran (``INFO commandstats``, commands inside scripts counted).
Two kinds of call alternate: a plain no-op, and an idempotent no-op with a fresh key each
time (so each one runs: a claim, a begin, a stored outcome). The estimate, calls/s per
Redis core, is 1 s over the Redis CPU per call: what one server could serve if nothing
else held it back (this machine's client and worker saturate long before it does). A
fleet that needs more than that needs a Redis that scales out (docs/deploy.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

from agent_client import run_scope
from bench import names
from bench.harness import PROJECT_ROOT, Bench
from bench.peers.usage import Reading, Usage, idle_usage
from bench.report import Goal, ScenarioResult, Table, rate
from bench.stats import alternate, keep_in_flight
from toolexec import WorkerProcess

NUMBER = 15
TITLE = "Redis CPU per call: how many calls a second one Redis core serves"

_TIMEOUT = 120.0
_WARMUP = 50
_PLAIN = "plain no-op"
_IDEMPOTENT = "idempotent no-op, each a fresh key"


def run(bench: Bench) -> ScenarioResult:
    """Redis CPU and commands per call, plain and idempotent, with calls in flight."""
    concurrency = bench.sizes.throughput_pool_concurrency
    worker = WorkerProcess(
        name="sizing",
        pool="asyncio",
        concurrency=concurrency,
        queues=[names.SIZING_QUEUE],
        env=bench.env,
        cwd=PROJECT_ROOT,
        log_dir=bench.logs,
    )
    with bench.launched([worker]):
        return _measure(bench, concurrency)


def _measure(bench: Bench, concurrency: int) -> ScenarioResult:
    sizes = bench.sizes
    in_flight, total = sizes.events_in_flight, sizes.sizing_calls
    plain = bench.tool(names.SIZING_PLAIN)
    idempotent = bench.tool(names.SIZING_IDEMPOTENT)
    keys = itertools.count()
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        _PLAIN: lambda: plain.invoke({}, timeout=_TIMEOUT),
        _IDEMPOTENT: lambda: idempotent.invoke({"key": next(keys)}, timeout=_TIMEOUT),
    }
    server, pid = bench.redis, bench.server.pid
    with run_scope():
        for call in calls.values():
            bench.run(keep_in_flight(call, min(in_flight, _WARMUP), _WARMUP))
        idle = idle_usage(server, pid, None)
        usage = {kind: Usage() for kind in calls}

        def block(kind: str) -> Callable[[], None]:
            def measured() -> None:
                before = Reading.take(server, pid, None)
                elapsed = bench.run(keep_in_flight(calls[kind], in_flight, total))
                usage[kind].add(
                    before, Reading.take(server, pid, None), seconds=elapsed, calls=total
                )

            return measured

        alternate([(kind, block(kind)) for kind in calls], sizes.events_rounds)
    net = {kind: u.net(idle) for kind, u in usage.items()}
    rows, goals = [], []
    for kind, u in net.items():
        per_call = u.per_call(u.redis)
        per_core = 1.0 / per_call if per_call > 0 else float("inf")
        rows.append(
            (
                kind,
                rate(u.rate),
                f"{per_call * 1e6:.1f}",
                f"{u.per_call(u.commands):.2f}",
                rate(per_core),
            )
        )
        goals.append(
            Goal(
                name=f"calls/s one Redis core serves, {kind}",
                measured=rate(per_core),
                target="information",
                met=None,
            )
        )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=(
                    f"call (asyncio -c {concurrency}, {in_flight} in flight)",
                    "calls/s here",
                    "Redis CPU µs/call",
                    "Redis commands/call",
                    "calls/s per Redis core",
                ),
                rows=rows,
            )
        ],
        goals=goals,
        notes=[
            (
                f"{sizes.events_rounds} alternated rounds of {total:,} calls per kind, "
                f"{in_flight} in flight from one client process, each block within one run "
                "scope (an idempotent call's key is its run and its arguments)."
            ),
            (
                "Redis CPU: user + system time of the server over each block, less its rate "
                f"over 1 s with no calls ({idle.redis / idle.seconds * 1000:.1f} ms/s); commands "
                f"likewise ({idle.commands / idle.seconds:.0f}/s: heartbeats, the workers' "
                "reads). Calls/s per Redis "
                "core: 1 s over the Redis CPU per call, the most one server serves. The OS "
                "counts CPU time in ticks of 10 ms, here "
                f"{_tick_share(net):.0%} of the least reading; runs on a shared machine "
                "differ by more."
            ),
        ],
    )


def _tick_share(usage: dict[str, Usage]) -> float:
    """One 10 ms tick against the least Redis CPU a kind was read at."""
    least = min((u.redis for u in usage.values()), default=0.0)
    return 0.01 / least if least > 0 else 1.0
