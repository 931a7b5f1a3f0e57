"""Tools the observability tests (progress, metrics, logs) load into real workers.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Every tool is on the ``observe`` queue, which only the workers these tests
start consume.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

import redis

from executor import report_progress, tool
from executor.worker import redis_client
from wire.settings import Settings

#: The queue of every tool here.
QUEUE = "observe"
#: Seconds a tool's Redis keys live.
_KEY_TTL = 120


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())


def _mark(marker: str | None) -> None:
    if marker:
        _redis().set(marker, "done", ex=_KEY_TTL)


@tool(queue=QUEUE)
def observe_steps(steps: int, pause: float = 0.0, marker: str | None = None) -> dict[str, Any]:
    """Report progress `steps` times (``i`` of `steps`), `pause` seconds apart; set `marker` at the end.

    Args:
        steps: How many steps to report.
        pause: Seconds between two steps; 0 for a hot loop.
        marker: A Redis key set once the last step is reported.
    """  # noqa: E501
    for step in range(1, steps + 1):
        report_progress(step, steps, f"step {step}")
        if pause:
            time.sleep(pause)
    _mark(marker)
    return {"steps": steps}


@tool(queue=QUEUE)
async def observe_steps_async(steps: int, pause: float = 0.0) -> dict[str, Any]:
    """:func:`observe_steps` as an ``async def`` tool.

    Args:
        steps: How many steps to report.
        pause: Seconds between two steps; 0 for a hot loop.
    """
    for step in range(1, steps + 1):
        report_progress(step, steps, f"step {step}")
        if pause:
            await asyncio.sleep(pause)
    return {"steps": steps}


@tool(queue=QUEUE)
def observe_steps_then_fail(steps: int, pause: float = 0.0) -> None:
    """Report `steps` steps, then raise ValueError.

    Args:
        steps: How many steps to report.
        pause: Seconds between two steps.
    """
    for step in range(1, steps + 1):
        report_progress(step, steps)
        if pause:
            time.sleep(pause)
    raise ValueError(f"failed after {steps} steps")


@tool(queue=QUEUE)
def observe_echo(text: str) -> str:
    """Return `text`.

    Args:
        text: Any text.
    """
    return text


@tool(queue=QUEUE)
def observe_fail(text: str) -> None:
    """Raise ValueError quoting `text`.

    Args:
        text: Any text.
    """
    raise ValueError(f"refused {text}")


@tool(queue=QUEUE, hard_timeout=0.5)
def observe_hard(seconds: float) -> dict[str, Any]:
    """Block for `seconds`, past the hard limit of 0.5 s.

    Args:
        seconds: How long to block.
    """
    time.sleep(seconds)
    return {"slept": seconds}


@tool(queue=QUEUE)
def observe_block(seconds: float, marker: str) -> dict[str, Any]:
    """Set `marker` to this process's PID, then block for `seconds`.

    Args:
        seconds: How long to block.
        marker: A Redis key set when the call starts.
    """
    _redis().set(marker, os.getpid(), ex=_KEY_TTL)
    time.sleep(seconds)
    return {"slept": seconds}


@tool(queue=QUEUE, delivery="at_least_once")
def observe_fail_counted(key: str) -> None:
    """INCR the Redis key `key`, then raise ValueError: an at-least-once failure tests can count.

    Args:
        key: The Redis key to increment.
    """
    _redis().incr(key)
    _redis().expire(key, _KEY_TTL)
    raise ValueError("counted failure")
