"""Probe tools that integration tests load into real workers.

Workers import this module through ``TOOLEXEC_TOOL_MODULES`` (the ``probe_env`` fixture
sets it); the test process itself never imports it, exactly as an agent never imports
the code of the tools it calls. Every probe makes what happened on the worker visible:
it echoes its input, records the PID that ran it, or counts its runs in Redis.

Tools on the ``default`` queue are served by the session's probe worker; tools on the
``single`` queue by one concurrency-1 worker at a time (``test_pools.py``); the tool on
the ``slow`` queue by a worker started for it (``test_catalog.py``); the tools on the
``aio`` queue by the asyncio-pool workers of ``test_asyncio_pool.py``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from typing import Any

import redis

from executor import current_call, tool
from executor.worker import redis_client
from wire.settings import Settings

#: Seconds a probe's Redis keys live; long enough for any test, short enough to vanish.
_KEY_TTL = 120


class ProbeFailure(Exception):
    """What ``probe_fail`` raises, so tests can tell its type from any builtin's."""


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    # One client per process: redis_client makes a new one after a fork.
    return redis_client(_settings())


def _record_pid(marker: str | None) -> None:
    if marker:
        _redis().set(marker, os.getpid(), ex=_KEY_TTL)


@tool
def probe_echo(
    text: str, number: int, ratio: float = 0.5, flags: list[bool] | None = None
) -> dict[str, Any]:
    """Return the arguments as received, with the call id and the worker's PID.

    Args:
        text: Any text.
        number: Any integer.
        ratio: Any number.
        flags: Any list of booleans, or null.
    """
    return {
        "text": text,
        "number": number,
        "ratio": ratio,
        "flags": flags,
        "nested": {"items": [text, number], "none": None},
        "call_id": current_call().call_id,
        "pid": os.getpid(),
    }


@tool
async def probe_async_echo(text: str) -> dict[str, Any]:
    """Return `text` from an ``async def`` tool, after yielding to its event loop once.

    Args:
        text: Any text.
    """
    await asyncio.sleep(0)
    return {"text": text, "pid": os.getpid()}


@tool
def probe_sleep(seconds: float, marker: str | None = None) -> dict[str, Any]:
    """Block for `seconds`; first store this process's PID under the Redis key `marker`.

    Args:
        seconds: How long to block.
        marker: A Redis key to set to the PID of the process running the call.
    """
    _record_pid(marker)
    time.sleep(seconds)
    return {"slept": seconds, "pid": os.getpid()}


@tool
def probe_fail(message: str) -> None:
    """Raise ProbeFailure with `message`.

    Args:
        message: The exception's message.
    """
    raise ProbeFailure(message)


@tool
def probe_count(key: str) -> int:
    """INCR the Redis key `key` and return its new value: a side effect tests can count.

    Args:
        key: The Redis key to increment.
    """
    count = int(_redis().incr(key))
    _redis().expire(key, _KEY_TTL)
    return count


@tool(queue="slow")
def probe_slow_lane(text: str) -> dict[str, Any]:
    """Return `text` and the worker's PID; served only on the ``slow`` queue.

    Args:
        text: Any text.
    """
    return {"text": text, "pid": os.getpid()}


# The same probes on the "single" queue, which one concurrency-1 worker serves at a time.
tool(name="probe_block_single", queue="single")(probe_sleep)
tool(name="probe_count_single", queue="single")(probe_count)
tool(name="probe_echo_single", queue="single")(probe_echo)


@tool(queue="single", hard_timeout=0.5)
def probe_hard_single(seconds: float) -> dict[str, Any]:
    """Block for `seconds`, past the tool's hard limit of 0.5 s.

    Args:
        seconds: How long to block.
    """
    time.sleep(seconds)
    return {"slept": seconds}


@tool(queue="single", hard_timeout=0.5)
async def probe_async_hard_single(seconds: float) -> dict[str, Any]:
    """Await `seconds` of sleep, past the tool's hard limit of 0.5 s.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return {"slept": seconds}


# The asyncio pool's probes, on the "aio" queue that test_asyncio_pool.py's workers serve.


@tool(queue="aio")
async def probe_async_wait(seconds: float, marker: str | None = None) -> dict[str, Any]:
    """Await `seconds` of sleep, as a tool waiting on I/O does; report where it ran.

    Args:
        seconds: How long to await.
        marker: A Redis key to set to the PID of the process running the call.
    """
    _record_pid(marker)
    began = time.time()
    await asyncio.sleep(seconds)
    return {
        "slept": seconds,
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "began": began,
        "ended": time.time(),
    }


@tool(queue="aio")
def probe_thread(seconds: float = 0.0) -> dict[str, Any]:
    """Block for `seconds` in a ``def`` tool; report the process and thread that ran it.

    Args:
        seconds: How long to block.
    """
    time.sleep(seconds)
    return {
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "call_id": current_call().call_id,
    }


@tool(queue="aio", hard_timeout=0.5)
async def probe_async_hard(seconds: float, marker: str) -> dict[str, Any]:
    """Await `seconds`, past the hard limit of 0.5 s; set `marker` to "cancelled" when cancelled.

    Args:
        seconds: How long to await.
        marker: A Redis key set to "cancelled" if the run is cancelled.
    """
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _redis().set(marker, "cancelled", ex=_KEY_TTL)
        raise
    return {"slept": seconds}


@tool(queue="aio", idempotent=True)
async def probe_async_idem(
    counter: str, seconds: float = 0.0, marker: str | None = None
) -> dict[str, Any]:
    """INCR `counter`, await `seconds`, return the count: an idempotent, at-least-once async tool.

    Args:
        counter: The Redis key counting this tool's runs.
        seconds: How long to await after counting.
        marker: A Redis key to set to the PID of the process running the call.
    """
    runs = int(_redis().incr(counter))
    _redis().expire(counter, _KEY_TTL)
    _record_pid(marker)
    await asyncio.sleep(seconds)
    return {"runs": runs, "pid": os.getpid()}
