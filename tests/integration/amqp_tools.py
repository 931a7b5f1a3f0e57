"""Tools the broker tests (``test_brokers.py``) load into real workers, on queues of their own.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
does. The tests run on a shared RabbitMQ, so the queues' names are unique to the test
session: the fixture puts a fresh prefix in ``AMQP_TOOLS_QUEUE`` of every worker it
starts, and deletes the queues at teardown. Every tool makes what it did visible in
Redis: how often it ran (``INCR``), and which process ran it.

Queues: ``<prefix>`` is served by the module's shared worker of each broker;
``<prefix>_solo`` by the concurrency-1 workers a test starts (and may kill) itself.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from typing import Any

import redis

from executor import current_call, tool
from executor.worker import redis_client
from wire.settings import Settings

from .broker_support import QUEUE_VARIABLE, queue_names

if not os.environ.get(QUEUE_VARIABLE):
    raise RuntimeError(f"{QUEUE_VARIABLE} must name this session's queue prefix (amqp_...)")
SHARED, SOLO = queue_names(os.environ[QUEUE_VARIABLE])

#: Seconds the tools' own Redis keys live.
_KEY_TTL = 300


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())


def _run(counter: str, marker: str | None = None) -> int:
    pipe = _redis().pipeline(transaction=False)
    pipe.incr(counter)
    pipe.expire(counter, _KEY_TTL)
    if marker:
        pipe.set(marker, os.getpid(), ex=_KEY_TTL)
    runs, *_ = pipe.execute()
    return int(runs)


@tool(queue=SHARED)
def broker_echo(text: str) -> dict[str, Any]:
    """Return ``text`` with the id of the call and the PID that ran it.

    Args:
        text: Any text.
    """
    return {"text": text, "call_id": current_call().call_id, "pid": os.getpid()}


@tool(queue=SHARED, idempotent=True)
def broker_count(counter: str, seconds: float = 0.0) -> dict[str, Any]:
    """Count this run under ``counter``, wait ``seconds``; a token unique to this execution.

    Args:
        counter: A Redis key incremented by every run.
        seconds: How long to wait after counting.
    """
    runs = _run(counter)
    time.sleep(seconds)
    return {"runs": runs, "token": uuid.uuid4().hex}


@tool(queue=SOLO)
def broker_slow(counter: str, seconds: float, marker: str = "") -> dict[str, Any]:
    """At most once: count this run, record the PID under ``marker``, wait ``seconds``.

    Args:
        counter: A Redis key incremented by every run.
        seconds: How long to wait.
        marker: A Redis key set to the PID running the call.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return {"runs": runs, "pid": os.getpid()}


@tool(queue=SOLO, delivery="at_least_once")
def broker_slow_alo(counter: str, seconds: float, marker: str = "") -> dict[str, Any]:
    """At least once: count this run, record the PID under ``marker``, wait ``seconds``.

    Args:
        counter: A Redis key incremented by every run.
        seconds: How long to wait.
        marker: A Redis key set to the PID running the call.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return {"runs": runs, "pid": os.getpid()}


@tool(queue=SOLO, idempotent=True, delivery="at_least_once")
def broker_book_alo(counter: str, seconds: float, marker: str = "") -> dict[str, Any]:
    """Idempotent, at least once: count this run, record the PID, wait ``seconds``.

    Args:
        counter: A Redis key incremented by every run.
        seconds: How long to wait.
        marker: A Redis key set to the PID running the call.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return {"runs": runs, "pid": os.getpid(), "token": uuid.uuid4().hex}


@tool(queue=SOLO, delivery="at_least_once")
def broker_crash_alo(counter: str) -> None:
    """At least once: count this run, then end the process running it at once.

    Args:
        counter: A Redis key incremented by every run.
    """
    _run(counter)
    os._exit(1)
