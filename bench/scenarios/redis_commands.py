"""9. Redis commands per call: a plain no-op, a submitted one and an idempotent first call.

One Redis serves every agent and worker, so the commands a call costs cap the whole
fleet. The count is the server's own: ``INFO commandstats`` before and after a block of
calls, the difference divided by the calls the client made (every block's calls
complete before the second reading). Commands a Lua script runs count, and so does the
script call itself (``EVALSHA``). Every idempotent call has a key of its own, so each
one dispatches (claim, run, store): a repeat the client has seen stored costs nothing.

What the workers and the client do in the background (heartbeats, the plain Celery
worker's polling) is counted too; its rate, read over a second with no calls, is
printed, and the "net" column takes it away. Calls in flight share round trips: the
client sends every call started in one event-loop turn in one pipeline (one claim
script for all its idempotent calls, one ``LPUSH`` per queue for all their messages)
and reads every reply waiting on its list at once, so the count per call falls as
calls in flight rise. What each call costs whatever the batching (the claim's ``SET``;
the worker's ``BRPOP``, begin ``SET NX``, store ``SET ... GET``, reply ``RPUSH`` and
``EXPIRE``) and the exact count one call at a time (11; a plain call 9) are asserted by
``tests/integration/test_command_counts.py``.

A submitted no-op (``tool.submit({}).result()``) is the plain call with what attaching
to it needs: its record (``HSET`` and ``PEXPIRE``, in the send's pipeline), marked
running and ended by its worker (one ``EVALSHA`` each, ``wire.handles``); it is printed
beside the plain call, so a plain call's count shows it pays none of that.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import redis

import agent_client
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table, count
from bench.stats import keep_in_flight

NUMBER = 9
TITLE = "Redis commands per call"

_TIMEOUT = 120.0
_PLAIN = "plain no-op"
_SUBMITTED = "submitted no-op (handle)"
_IDEMPOTENT = "idempotent no-op, first call"
#: The issue's goal for an idempotent call.
_GOAL = 8.0
#: Command names shown per side, most frequent first.
_SHOWN = 8


def run(bench: Bench) -> ScenarioResult:
    """Commands per call of each side at each level of calls in flight."""
    noop = bench.tool("noop")
    idempotent = bench.tool("noop_idempotent")
    keys = itertools.count()
    sides: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        (_PLAIN, lambda: noop.invoke({}, timeout=_TIMEOUT)),
        (_SUBMITTED, lambda: noop.submit({}, timeout=_TIMEOUT).result()),
        (_IDEMPOTENT, lambda: idempotent.invoke({"key": next(keys)}, timeout=_TIMEOUT)),
    ]
    n = bench.sizes.command_calls
    for _, call in sides:  # warm: scripts loaded, connections open, pool children forked
        bench.run(_calls(call, 10, 20))
    idle = _background(bench.redis, seconds=1.0)
    rows = []
    measured: dict[tuple[str, int], float] = {}
    for in_flight in bench.sizes.command_in_flight:
        for name, call in sides:
            before, start = _commands(bench.redis), time.monotonic()
            bench.run(_calls(call, in_flight, n))
            elapsed = time.monotonic() - start
            delta = _commands(bench.redis) - before
            delta.pop("info", None)  # the readings themselves
            total = sum(delta.values())
            per_call = total / n
            net = max(0.0, total - idle * elapsed) / n
            measured[(name, in_flight)] = per_call
            shown = ", ".join(f"{c} {k / n:.2f}" for c, k in delta.most_common(_SHOWN))
            rows.append((name, f"{in_flight:,}", count(n), f"{per_call:.2f}", f"{net:.2f}", shown))
    top = max(bench.sizes.command_in_flight)
    idem = measured[(_IDEMPOTENT, top)]
    submitted = "; ".join(
        f"{level:,} in flight {measured[(_PLAIN, level)]:.2f} plain, "
        f"{measured[(_SUBMITTED, level)]:.2f} submitted "
        f"(+{measured[(_SUBMITTED, level)] - measured[(_PLAIN, level)]:.2f})"
        for level in bench.sizes.command_in_flight
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[
            Table(
                columns=(
                    "call",
                    "in flight",
                    "calls",
                    "commands per call",
                    "net of background",
                    "per call, by command",
                ),
                rows=rows,
            )
        ],
        goals=[
            Goal(
                name=f"Redis commands per idempotent call, {top:,} in flight",
                measured=f"{idem:.2f}",
                target=f"≤ {_GOAL:g}",
                met=idem <= _GOAL,
            )
        ],
        notes=[
            (
                f"`INFO commandstats` before and after {n:,} calls per block (calls counted by "
                "the client); commands inside Lua scripts count."
            ),
            (
                f"Background with no calls: {idle:.1f} commands/s (heartbeats, the plain Celery "
                "worker's polling)."
            ),
            (
                f"Plain no-op at {top:,} in flight for comparison: "
                f"{measured[(_PLAIN, top)]:.2f} commands per call."
            ),
            (
                "A submitted no-op beside the plain one (its record, marked running and ended): "
                f"{submitted} commands per call."
            ),
        ],
    )


async def _calls(call: Callable[[], Awaitable[object]], in_flight: int, total: int) -> float:
    # In one run scope (entered on the benchmark's loop, where the calls run): each
    # idempotent call still has a key of its own, its own arguments.
    with agent_client.run_scope():
        return await keep_in_flight(call, in_flight, total)


def _commands(client: redis.Redis) -> Counter[str]:
    """Commands the server has run so far, by name."""
    stats = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()})


def _background(client: redis.Redis, *, seconds: float) -> float:
    """Commands per second the server runs with no call in flight."""
    before, start = _commands(client), time.monotonic()
    time.sleep(seconds)
    delta = _commands(client) - before
    delta.pop("info", None)
    return sum(delta.values()) / (time.monotonic() - start)
