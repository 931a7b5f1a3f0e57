"""16. What the run log costs: ``TOOLEXEC_RUN_LOG`` on and off.

Each call's life goes into its run's event log in Redis (:mod:`wire.runlog`), which
``toolexec ui`` shows: the client logs each call sent (and, only where they happen, joins,
timeouts and errors it made itself), in a pipeline of its own per turn of its I/O loop;
the worker logs each outcome delivered, with its start, from a thread that flushes every
0.2 s (and a ``started`` event for a call still running after one flush). Two asyncio
workers (``-c`` as in scenario 2) and two clients, one of each with the log on and one
with it off, each worker on a queue and no-op of its own; blocks alternate between the
two sides: sequential calls (their p50 and p99), then calls kept in flight (calls/s).

Each block is one run of its own. Its calls/s is its calls over the time they took; its
CPU and Redis commands are read once both sides' last flushes are in (the log asked only
its length meanwhile), so that a side's commands include all its log writes; then the
log is read back, outside the reading. Events per call are counted in that log by who
wrote them (``started`` and ``ended``: the worker; the rest: the client). Redis commands
per call are ``INFO commandstats`` around the in-flight blocks, less the rate with no
calls over the whole reading (:mod:`bench.peers.usage`); the ratios divide the side that
logs by the side that does not.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agent_client import ToolClient, remote_tool
from bench import names
from bench.harness import PROJECT_ROOT, Bench
from bench.peers.usage import Reading, Usage, idle_usage
from bench.report import Goal, ScenarioResult, Table, ms, rate, ratio
from bench.stats import Latencies, alternate, keep_in_flight, timed_async
from toolexec import WorkerProcess
from wire import keys
from wire.runlog import ENDED, FLUSH_INTERVAL, STARTED
from wire.settings import Settings

NUMBER = 16
TITLE = "The run log's cost per call: TOOLEXEC_RUN_LOG on and off"

_TIMEOUT = 120.0
_WARMUP = 50
#: How each value of TOOLEXEC_RUN_LOG reads in the tables.
_LABEL = {"on": "on: every call logged", "off": "off: nothing logged"}
#: Every event of a block stays in its run's log (the default keeps the newest 10,000).
_MAX_EVENTS = "1000000"


def run(bench: Bench) -> ScenarioResult:
    """Sequential p50/p99, calls/s, CPU, Redis commands and log events per call, each way."""
    concurrency = bench.sizes.throughput_pool_concurrency
    built = [
        WorkerProcess(
            name=f"runlog-{mode}",
            pool="asyncio",
            concurrency=concurrency,
            queues=[names.runlog_queue(mode)],
            env={**bench.env, "TOOLEXEC_RUN_LOG": mode, "TOOLEXEC_RUN_LOG_MAX": _MAX_EVENTS},
            cwd=PROJECT_ROOT,
            log_dir=bench.logs,
        )
        for mode in names.RUN_LOG
    ]
    with bench.launched(built) as workers, _clients(bench) as clients:
        pids = dict(zip(names.RUN_LOG, (w.pid for w in workers), strict=True))
        return _measure(bench, pids, clients, concurrency)


@contextmanager
def _clients(bench: Bench) -> Iterator[dict[str, ToolClient]]:
    made = {
        mode: ToolClient(
            Settings.from_env(
                {**bench.env, "TOOLEXEC_RUN_LOG": mode, "TOOLEXEC_RUN_LOG_MAX": _MAX_EVENTS}
            )
        )
        for mode in names.RUN_LOG
    }
    try:
        yield made
    finally:
        for client in made.values():
            client.close()


def _measure(
    bench: Bench, pids: dict[str, int | None], clients: dict[str, ToolClient], concurrency: int
) -> ScenarioResult:
    sizes = bench.sizes
    in_flight, total, sequential = sizes.events_in_flight, sizes.events_calls, sizes.roundtrip_calls
    warm = {mode: _caller(clients[mode], mode, f"bench-warm-{uuid.uuid4().hex}") for mode in pids}
    for call in warm.values():  # connections open, scripts loaded
        bench.run(keep_in_flight(call, min(in_flight, _WARMUP), _WARMUP))
    idle = {mode: idle_usage(bench.redis, bench.server.pid, pid) for mode, pid in pids.items()}
    usage = {mode: Usage() for mode in pids}
    latencies: dict[str, list[list[float]]] = {mode: [] for mode in pids}
    events: dict[str, collections.Counter[str]] = {mode: collections.Counter() for mode in pids}
    stored: list[float] = []  # bytes of each in-flight block's run log, per call

    def block(mode: str) -> Callable[[], None]:
        def measured() -> None:
            run_id = f"bench-runlog-{uuid.uuid4().hex}"
            latencies[mode].append(bench.run(timed_async(warm[mode], sequential)))
            call = _caller(clients[mode], mode, run_id)
            before = Reading.take(bench.redis, bench.server.pid, pids[mode])
            started = time.perf_counter()
            bench.run(keep_in_flight(call, in_flight, total))
            elapsed = time.perf_counter() - started
            polls = 0
            if mode == "on":  # its last flushes, each side's, are the block's too
                polls = _until_written(bench, run_id, total)
            after = Reading.take(bench.redis, bench.server.pid, pids[mode])
            after = dataclasses.replace(after, commands=after.commands - polls)
            span = time.perf_counter() - started
            usage[mode].add(before, after, seconds=elapsed, calls=total, span=span)
            if mode == "on":  # read back outside the block: its CPU and commands are ours
                events[mode].update(_logged(bench, run_id, total))
                stored.append(_bytes(bench, run_id) / total)

        return measured

    alternate([(mode, block(mode)) for mode in pids], sizes.events_rounds)
    net = {mode: usage[mode].net(idle[mode]) for mode in pids}
    seen = {mode: Latencies.of(latencies[mode]) for mode in pids}
    calls = usage["on"].calls
    by_worker = (events["on"][STARTED] + events["on"][ENDED]) / calls
    by_client = (sum(events["on"].values()) - events["on"][STARTED] - events["on"][ENDED]) / calls
    rows = [
        (
            _LABEL[mode],
            ms(seen[mode].p50),
            ms(seen[mode].p99),
            rate(net[mode].rate),
            f"{net[mode].per_call(net[mode].main + net[mode].children) * 1e6:.0f}",
            f"{net[mode].per_call(net[mode].client) * 1e6:.0f}",
            f"{net[mode].per_call(net[mode].commands):.2f}",
            f"{by_worker:.2f}" if mode == "on" else "0",
            f"{by_client:.2f}" if mode == "on" else "0",
        )
        for mode in pids
    ]
    on, off = net["on"], net["off"]
    added = on.per_call(on.commands) - off.per_call(off.commands)
    memory = sum(stored) / len(stored)
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
                    "client CPU µs/call",
                    "Redis commands/call",
                    "log events/call, worker",
                    "log events/call, client",
                ),
                rows=rows,
            )
        ],
        goals=[
            Goal(
                name="run log events (one command each) per call, worker's side",
                measured=f"{by_worker:.2f}",
                target="≤ 1",
                met=by_worker <= 1.0,
            ),
            Goal(
                name=f"Redis commands per call added by the run log, {in_flight} in flight",
                measured=f"{added:+.2f}",
                target="information",
                met=None,
            ),
            Goal(
                name="Redis memory of the run log per call (MEMORY USAGE of a block's log)",
                measured=f"{memory:.0f} bytes",
                target="information",
                met=None,
            ),
            Goal(
                name="log on / log off, sequential p50",
                measured=ratio(seen["on"].p50 / seen["off"].p50),
                target="information",
                met=None,
            ),
            Goal(
                name=f"log on / log off, calls/s at {in_flight} in flight",
                measured=ratio(on.rate / off.rate),
                target="information",
                met=None,
            ),
        ],
        notes=[
            (
                f"{sizes.events_rounds} alternated rounds per side: {sequential} sequential no-op "
                f"calls, then {total:,} with {in_flight} in flight from one client per side "
                "(both in this process); each in-flight block is one run."
            ),
            (
                "Log events per call: the events in each block's run log, by who writes "
                "them (the worker: started, ended; the client: the rest), each one XADD. "
                "Beside them the client sends one PEXPIRE of each run's log per flush (at "
                "most one every 50 ms), and at most once a second a ZADD and a "
                "ZREMRANGEBYSCORE of the recent-runs index and its PEXPIRE."
            ),
            (
                "An in-flight block's calls/s is its calls over the time they took; its "
                "CPU and commands are read once its run's log holds an event of each side "
                "per call and has not grown for a worker's flush interval (0.2 s; only XLEN "
                "asked, and those commands taken off), so both sides' last flushes are "
                "counted; its log is read back after that reading. CPU: the side's worker "
                "(all of it over the calls, above its idle rate over the wait), and this "
                "process above its idle rate over the whole reading (both clients live here)."
            ),
        ],
    )


def _until_written(bench: Bench, run_id: str, calls: int) -> int:
    """Wait until ``run_id``'s log holds at least an event from each side per call and
    has then not grown for longer than a worker's flush interval; the ``XLEN``s asked.

    Only ``XLEN`` is asked, every 20 ms (no entry read, so the waiting costs this process
    and Redis next to nothing); the caller takes those commands off the block's count,
    and the processes' idle rates over the wait come off their CPU (``Usage.span``).
    """
    deadline = time.monotonic() + 30.0
    key = keys.run_log(run_id)
    length, grew_at, polls = -1, time.monotonic(), 0
    while time.monotonic() < deadline:
        now, seen = time.monotonic(), int(bench.redis.xlen(key))
        polls += 1
        if seen != length:
            length, grew_at = seen, now
        elif length >= 2 * calls and now - grew_at > FLUSH_INTERVAL + 0.05:
            break
        time.sleep(0.02)
    return polls


def _logged(bench: Bench, run_id: str, calls: int) -> collections.Counter[str]:
    """The events of ``run_id``'s log by kind, once it holds an end for each of ``calls``."""
    deadline = time.monotonic() + 30.0
    while True:
        entries: list[Any] = bench.redis.xrange(keys.run_log(run_id)) or []
        found = collections.Counter(_text(fields.get(b"e", b"?")) for _, fields in entries)
        if found[ENDED] >= calls or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _bytes(bench: Bench, run_id: str) -> int:
    """What ``run_id``'s log takes in Redis (``MEMORY USAGE``, every entry sampled)."""
    used = bench.redis.memory_usage(keys.run_log(run_id), samples=0)
    return int(used or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _caller(client: ToolClient, mode: str, run_id: str) -> Callable[[], Awaitable[object]]:
    tool = remote_tool(names.runlog_tool(mode), client=client)
    return lambda: tool.invoke({}, timeout=_TIMEOUT, run_id=run_id)
