"""Tools that misbehave on purpose, served on the ``faults`` queue by workers the fault tests start.

Workers import this module through ``TOOLEXEC_TOOL_MODULES`` (the test process never
does). Each tool makes what it did visible in Redis: how often it ran (``INCR``), or
which process ran it, so a test can tell what happened on the worker.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import threading
from typing import Any

import redis

from executor import tool
from executor.worker import redis_client
from wire.settings import Settings

#: The queue every tool here is served on.
QUEUE = "faults"
#: Seconds a tool's Redis keys live.
_KEY_TTL = 120


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())


def _count(key: str) -> int:
    count = int(_redis().incr(key))
    _redis().expire(key, _KEY_TTL)
    return count


@tool(queue=QUEUE, idempotent=True)
def fault_crash(counter: str) -> None:
    """Count this run under `counter`, then end the process running it at once.

    Args:
        counter: A Redis key incremented by every run.
    """
    _count(counter)
    os._exit(1)


@tool(queue=QUEUE, delivery="at_least_once")
def fault_crash_plain(counter: str) -> None:
    """Like fault_crash, for a non-idempotent at-least-once tool.

    Args:
        counter: A Redis key incremented by every run.
    """
    _count(counter)
    os._exit(1)


@tool(queue=QUEUE, idempotent=True)
def fault_kill_worker(counter: str) -> None:
    """Count this run under `counter`, then SIGKILL the whole worker (a prefork pool's parent).

    Args:
        counter: A Redis key incremented by every run.
    """
    _count(counter)
    os.kill(os.getppid(), signal.SIGKILL)  # the pool process follows it (Celery's pdeathsig)
    os._exit(1)


@tool(queue=QUEUE, hard_timeout=0.5)
def fault_spin(marker: str) -> None:
    """Store this process's PID under `marker`, then spin forever, ignoring everything.

    Args:
        marker: A Redis key set to the PID of the process running the call; the
            spinning thread's own id goes under `marker` + ":thread".
    """
    _redis().set(f"{marker}:thread", threading.get_native_id(), ex=_KEY_TTL)
    _redis().set(marker, os.getpid(), ex=_KEY_TTL)
    while True:
        pass


@tool(queue=QUEUE, idempotent=True, hard_timeout=0.5)
def fault_spin_counted(counter: str) -> None:
    """Count this run under `counter`, then spin forever: an at-least-once runaway.

    Args:
        counter: A Redis key incremented by every run.
    """
    _count(counter)
    while True:
        pass


@tool(queue=QUEUE, hard_timeout=0.5)
async def fault_stubborn(counter: str) -> None:
    """Count a step under `counter` every 50 ms, forever, ignoring cancellation.

    Args:
        counter: A Redis key incremented at every step.
    """
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            continue
        _count(counter)


@tool(queue=QUEUE)
def fault_exit(code: int) -> None:
    """Call ``sys.exit(code)``.

    Args:
        code: The exit status asked for.
    """
    sys.exit(code)


@tool(queue=QUEUE, idempotent=True)
def fault_exit_idempotent(code: int) -> None:
    """Call ``sys.exit(code)`` in an idempotent, at-least-once tool.

    Args:
        code: The exit status asked for.
    """
    sys.exit(code)


@tool(queue=QUEUE)
def fault_echo(text: str) -> dict[str, Any]:
    """Return `text` and the PID of the process that ran the call.

    Args:
        text: Any text.
    """
    return {"text": text, "pid": os.getpid()}
