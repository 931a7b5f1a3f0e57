"""13. Replica acknowledgements: what ``TOOLEXEC_REPLICA_ACKS=1`` costs per call.

Idempotent no-op calls (a fresh key each, so each one runs: a begin and a stored outcome),
through a real worker, with and without the worker waiting for a replica. Each side has a
private Redis master with one replica of its own (``redis-server --replicaof``), a toolexec
worker (the shared pool and concurrency) and a client: the setting is the worker's, so the
two cannot share a Redis. Blocks alternate (A B A B ...): one call at a time, then
``events_in_flight`` calls in flight. Redis commands per call are counted on each master
(``INFO commandstats``, ``WAIT`` apart), background included.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis

from agent_client import RemoteTool, ToolClient, remote_tool, run_scope
from bench.harness import PROJECT_ROOT, Bench
from bench.report import Goal, ScenarioResult, Table, count, ms, ratio
from bench.stats import Latencies, alternate
from toolexec import RedisServer, WorkerProcess
from wire.settings import Settings

NUMBER = 13
TITLE = "Replica acknowledgements: what TOOLEXEC_REPLICA_ACKS costs per call"

_TIMEOUT = 10.0
_SIDES = {"no wait (TOOLEXEC_REPLICA_ACKS=0)": 0, "wait for 1 replica (=1)": 1}


@dataclass
class _Side:
    """One side: its idempotent no-op, its master (for command counts), its key source."""

    tool: RemoteTool
    master: redis.Redis
    keys: Iterator[int]


@contextlib.contextmanager
def _side(bench: Bench, acks: int) -> Iterator[_Side]:
    """A master and its replica, a worker on them and a client of them."""
    with contextlib.ExitStack() as stack:
        root = bench.logs.parent / f"replicas-{acks}"
        master = stack.enter_context(RedisServer(directory=root / "master"))
        replica = RedisServer(
            directory=root / "replica", extra_args=["--replicaof", "127.0.0.1", str(master.port)]
        )
        stack.enter_context(replica)
        store = redis.Redis.from_url(master.url)
        stack.callback(store.close)
        _wait_in_sync(store)
        env = {
            **bench.env,
            "TOOLEXEC_BROKER_URL": master.url,
            "TOOLEXEC_REDIS_URL": master.url,
            "TOOLEXEC_REPLICA_ACKS": str(acks),
        }
        worker = WorkerProcess(
            name=f"replicas-{acks}",
            pool=bench.options.pool,
            concurrency=bench.options.concurrency,
            queues=("default",),
            env=env,
            cwd=PROJECT_ROOT,
            log_dir=bench.logs,
        )
        stack.enter_context(worker)
        client = ToolClient(Settings.from_env(env))
        stack.callback(client.close)
        yield _Side(remote_tool("noop_idempotent", client=client), store, itertools.count())


def _wait_in_sync(master: redis.Redis, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while int(master.info("replication").get("connected_slaves", 0)) < 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark's replica did not connect")
        time.sleep(0.05)


def _commands(master: redis.Redis) -> tuple[int, int]:
    """Commands the master ran so far (inside scripts too), and of them ``WAIT``."""
    stats = master.info("commandstats")
    total = sum(int(entry["calls"]) for entry in stats.values())
    return total, int(stats.get("cmdstat_wait", {}).get("calls", 0))


def _sequential(side: _Side, n: int) -> Callable[[], tuple[list[float], float, int, int]]:
    def block() -> tuple[list[float], float, int, int]:
        before = _commands(side.master)
        durations = []
        started = time.perf_counter()
        with run_scope():
            for _ in range(n):
                start = time.perf_counter()
                side.tool.invoke_sync({"key": next(side.keys)}, timeout=_TIMEOUT)
                durations.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - started
        after = _commands(side.master)
        return durations, elapsed, after[0] - before[0], after[1] - before[1]

    return block


def _in_flight(
    bench: Bench, side: _Side, n: int, width: int
) -> Callable[[], tuple[list[float], float, int, int]]:
    async def calls() -> None:
        gate = asyncio.Semaphore(width)

        async def one() -> None:
            async with gate:
                await side.tool.invoke({"key": next(side.keys)}, timeout=_TIMEOUT)

        with run_scope():
            await asyncio.gather(*(one() for _ in range(n)))

    def block() -> tuple[list[float], float, int, int]:
        before = _commands(side.master)
        started = time.perf_counter()
        bench.run(calls())
        elapsed = time.perf_counter() - started
        after = _commands(side.master)
        return [], elapsed, after[0] - before[0], after[1] - before[1]

    return block


def run(bench: Bench) -> ScenarioResult:
    """Alternate the two sides' blocks, one at a time and then many in flight."""
    sizes = bench.sizes
    n, width, wide = sizes.idempotent_pairs, sizes.events_in_flight, sizes.events_calls
    with contextlib.ExitStack() as stack:
        sides = {name: stack.enter_context(_side(bench, acks)) for name, acks in _SIDES.items()}
        for side in sides.values():
            _sequential(side, sizes.warmup)()
        one = alternate([(name, _sequential(s, n)) for name, s in sides.items()], sizes.rounds)
        many = alternate(
            [(name, _in_flight(bench, s, wide, width)) for name, s in sides.items()], sizes.rounds
        )
    rows = []
    p50s: dict[str, float] = {}
    rates: dict[str, float] = {}
    for name in _SIDES:
        latencies = Latencies.of([block[0] for block in one[name]])
        calls = n * len(one[name])
        commands = sum(block[2] for block in one[name]) / calls
        waits = sum(block[3] for block in one[name]) / calls
        wide_calls = wide * len(many[name])
        rate = wide_calls / sum(block[1] for block in many[name])
        wide_commands = sum(block[2] for block in many[name]) / wide_calls
        p50s[name], rates[name] = latencies.p50, rate
        rows.append(
            (
                name,
                count(calls),
                ms(latencies.p50),
                ms(latencies.p99),
                f"{commands:.2f}",
                f"{waits:.2f}",
                f"{rate:,.0f}",
                f"{wide_commands:.2f}",
            )
        )
    plain, waiting = list(_SIDES)
    added = p50s[waiting] - p50s[plain]
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=(
                    "side",
                    "calls",
                    "p50 ms",
                    "p99 ms",
                    "Redis commands/call",
                    "WAIT/call",
                    f"calls/s, {width} in flight",
                    f"Redis commands/call, {width} in flight",
                ),
                rows=rows,
            )
        ],
        goals=[
            Goal(
                name="REPLICA_ACKS=1 p50 − REPLICA_ACKS=0 p50, idempotent call",
                measured=f"{added * 1e3:+.3f} ms",
                target="information",
                met=None,
            ),
            Goal(
                name=f"REPLICA_ACKS=1 / REPLICA_ACKS=0 calls/s, {width} in flight",
                measured=ratio(rates[waiting] / rates[plain]),
                target="information",
                met=None,
            ),
        ],
        notes=[
            (
                f"{sizes.rounds} rounds, A B A B, of {n} sequential idempotent no-op calls and "
                f"then of {wide} with {width} in flight, each with a fresh key (so each runs "
                f"and stores its outcome); each side on its own master and replica, with a "
                f"{bench.options.pool} -c {bench.options.concurrency} worker."
            ),
            (
                "Commands per call: INFO commandstats of the side's master, before and after "
                "each block, background (heartbeats, polls) and the replica's REPLCONF ACKs "
                "included."
            ),
        ],
    )
