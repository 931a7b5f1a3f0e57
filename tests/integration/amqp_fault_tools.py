"""Tools the broker fault tests (``test_amqp_faults.py``) load into real workers.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
does. Like ``amqp_tools.py`` they are served on a queue whose name is unique to the
test session (``<prefix>_faults``, the prefix in ``AMQP_TOOLS_QUEUE``), deleted from
RabbitMQ at its end. Every tool makes what it did visible in Redis: how often it ran
(``INCR``), and which process ran it.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

import redis

from executor import tool
from executor.worker import redis_client
from wire.settings import Settings

from .broker_support import QUEUE_VARIABLE

if not os.environ.get(QUEUE_VARIABLE):
    raise RuntimeError(f"{QUEUE_VARIABLE} must name this session's queue prefix (amqp_...)")
QUEUE = f"{os.environ[QUEUE_VARIABLE]}_faults"

#: Seconds the tools' own Redis keys live.
_KEY_TTL = 300


@functools.cache
def _redis() -> redis.Redis:
    return redis_client(Settings.from_env())


def _run(counter: str, marker: str = "") -> int:
    pipe = _redis().pipeline(transaction=False)
    pipe.incr(counter)
    pipe.expire(counter, _KEY_TTL)
    if marker:
        pipe.set(marker, os.getpid(), ex=_KEY_TTL)
    runs, *_ = pipe.execute()
    return int(runs)


@tool(queue=QUEUE)
def fault_die_first(counter: str, flag: str) -> dict[str, Any]:
    """At most once: count this run; the first run kills its whole worker at once.

    The worker's process group is SIGKILLed the moment the tool starts, before the
    worker's heartbeat can name the call.

    Args:
        counter: A Redis key incremented by every run.
        flag: A Redis key the first run sets; a later run finds it and returns.
    """
    return _die_first(counter, flag)


def _die_first(counter: str, flag: str) -> dict[str, Any]:
    runs = _run(counter)
    if _redis().set(flag, "1", nx=True, ex=_KEY_TTL):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return {"runs": runs, "pid": os.getpid()}


@tool(queue=QUEUE, delivery="at_least_once")
def fault_die_first_alo(counter: str, flag: str) -> dict[str, Any]:
    """At least once: count this run; the first run kills its whole worker at once.

    Args:
        counter: A Redis key incremented by every run.
        flag: A Redis key the first run sets; a later run finds it and returns.
    """
    return _die_first(counter, flag)


@tool(queue=QUEUE)
def fault_sleep(counter: str, seconds: float, marker: str = "") -> dict[str, Any]:
    """At most once: count this run, record the PID under ``marker``, wait ``seconds``.

    Args:
        counter: A Redis key incremented by every run.
        seconds: How long to wait.
        marker: A Redis key set to the PID running the call.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return {"runs": runs, "pid": os.getpid()}


@tool(queue=QUEUE, idempotent=True, delivery="at_most_once")
def fault_book_amo(counter: str, seconds: float, marker: str = "") -> dict[str, Any]:
    """Idempotent, at most once: count this run, record the PID, wait ``seconds``.

    Args:
        counter: A Redis key incremented by every run.
        seconds: How long to wait.
        marker: A Redis key set to the PID running the call.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return {"runs": runs, "pid": os.getpid()}


@tool(queue=QUEUE)
def fault_mark(key: str) -> str:
    """At most once: set the Redis key ``key``, to show that the call ran.

    Args:
        key: A Redis key.
    """
    _redis().set(key, os.getpid(), ex=_KEY_TTL)
    return key
