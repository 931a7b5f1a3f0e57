"""The tools the benchmark's toolexec workers serve (``TOOLEXEC_TOOL_MODULES=bench.tools``).

Each one is as small as the measurement allows: a no-op for round trips, an idempotent
no-op for cache hits, a sleep that waits like I/O, and the shedding scenario's busy call
and marker. Like any tool, these read no environment variables themselves: the Redis
they write to comes from :meth:`Settings.from_env`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Annotated

import redis
from pydantic import Field

from bench import names
from executor import tool
from executor.worker import redis_client
from wire.settings import Settings

__all__ = [
    "async_sleep_ms",
    "blocking_sleep_ms",
    "noop",
    "noop_idempotent",
    "noop_pool",
    "shed_busy",
    "shed_mark",
    "sleep_ms",
]

Milliseconds = Annotated[
    int, Field(ge=0, le=600_000, description="How long to wait, in milliseconds.")
]


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())


@tool
def noop() -> None:
    """Do nothing and return at once; the round trip is what is measured."""


@tool(queue=names.POOL_QUEUE)
def noop_pool() -> None:
    """Do nothing: ``noop`` on the queue of the throughput scenario's second pool."""


@tool(idempotent=True)
def noop_idempotent(key: int) -> int:
    """Return ``key``; repeats with the same key in one run share one execution.

    Args:
        key: Any number; two calls with the same key in one run are the same call.
    """
    return key


@tool
def sleep_ms(ms: Milliseconds) -> int:
    """Wait ``ms`` milliseconds without using the CPU, as a tool waiting on I/O does."""
    time.sleep(ms / 1000)
    return ms


@tool(queue=names.ASYNC_QUEUE)
async def async_sleep_ms(ms: Milliseconds) -> int:
    """Await ``ms`` milliseconds, as an ``async def`` tool awaiting an API does."""
    await asyncio.sleep(ms / 1000)
    return ms


@tool(queue=names.ASYNC_QUEUE)
def blocking_sleep_ms(ms: Milliseconds) -> int:
    """Wait ``ms`` milliseconds in a ``def`` tool: ``async_sleep_ms`` as gevent runs waits.

    On Celery's gevent pool ``time.sleep`` is monkey-patched, so the wait yields to the
    other greenlets as an ``await`` yields to the other coroutines.
    """
    time.sleep(ms / 1000)
    return ms


@tool(queue=names.SHED_QUEUE)
def shed_busy(ms: Milliseconds) -> int:
    """Keep the shedding scenario's only worker busy for ``ms`` milliseconds."""
    client = _redis()
    client.set(names.SHED_BUSY, "1", px=ms + 1000)
    try:
        time.sleep(ms / 1000)
    finally:
        client.delete(names.SHED_BUSY)
    return ms


@tool(queue=names.SHED_QUEUE)
def shed_mark() -> None:
    """Count one run: every run of this tool is a queued call that was not shed."""
    _redis().incr(names.SHED_RAN)


def _scaled_sleep(ms: Milliseconds) -> int:
    """Wait ``ms`` milliseconds without using the CPU (the scaling scenario's tool)."""
    time.sleep(ms / 1000)
    return ms


# One tool per worker count, each on its own queue, so that the scaling scenario can
# alternate 1, 2 and 4 workers without starting or stopping any of them.
for _processes in names.SCALE_QUEUES:
    tool(name=names.scale_tool(_processes), queue=names.scale_queue(_processes))(_scaled_sleep)


def _events_noop() -> None:
    """Do nothing: the task-events scenario's no-op, one per worker it compares."""


# One no-op per worker of the task-events scenario (each pool, task events on and off),
# each on its own queue, so that its blocks alternate without restarting any worker.
for _pool, _events in names.EVENTS_WORKERS:
    tool(name=names.events_tool(_pool, _events), queue=names.events_queue(_pool, _events))(
        _events_noop
    )


def _reads_noop() -> None:
    """Do nothing: the loop-reads scenario's no-op, one per worker it compares."""


# One no-op per worker of the loop-reads scenario (TOOLEXEC_LOOP_READS on and off).
for _mode in names.LOOP_READS:
    tool(name=names.reads_tool(_mode), queue=names.reads_queue(_mode))(_reads_noop)


def _runlog_noop() -> None:
    """Do nothing: the run-log scenario's no-op, one per worker it compares."""


# One no-op per worker of the run-log scenario (TOOLEXEC_RUN_LOG on and off).
for _mode in names.RUN_LOG:
    tool(name=names.runlog_tool(_mode), queue=names.runlog_queue(_mode))(_runlog_noop)


@tool(name=names.SIZING_PLAIN, queue=names.SIZING_QUEUE)
def sizing_noop() -> None:
    """Do nothing: scenario 15's plain call."""


@tool(name=names.SIZING_IDEMPOTENT, queue=names.SIZING_QUEUE, idempotent=True)
def sizing_noop_idempotent(key: int) -> int:
    """Return ``key``: scenario 15's idempotent call (a fresh key each time, so each runs).

    Args:
        key: Any number; two calls with the same key in one run are the same call.
    """
    return key
