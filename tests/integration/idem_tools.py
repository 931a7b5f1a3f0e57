"""Idempotent test tools that ``test_idempotency.py`` loads into real workers.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it (it reads results and Redis counters only). Every tool counts its runs with
INCR on a Redis key the test chooses, so "the body ran once" is a number a test can
read, and records the PID of the process running it under ``marker`` so a test can
kill exactly that process mid-call.

Queues: ``idem`` is served by the module's shared worker; ``idem_kill`` by the
workers a kill test starts (and kills) for itself.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from typing import Any

import redis
from pydantic import BaseModel

from executor import current_call, tool
from executor.worker import redis_client
from tasks import flights
from wire.settings import Settings

#: Seconds the tools' own Redis keys live: every key a test writes has a TTL.
_KEY_TTL = 300


class IdemFailure(Exception):
    """What the failing tools raise."""


class Seat(BaseModel):
    """A seat preference, to give the schema a nested model with defaults."""

    row: int = 1
    window: bool = False


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())


def _run(counter: str, marker: str | None) -> int:
    pipe = _redis().pipeline(transaction=False)
    pipe.incr(counter)
    pipe.expire(counter, _KEY_TTL)
    if marker:
        pipe.set(marker, os.getpid(), ex=_KEY_TTL)
    runs, *_ = pipe.execute()
    return int(runs)


def _report(counter: str, runs: int) -> dict[str, Any]:
    call = current_call()
    return {
        "counter": counter,
        "runs": runs,
        "token": uuid.uuid4().hex,  # differs per execution: equal results mean one execution
        "run_id": call.run_id,
        "idempotency_key": call.idempotency_key,
        "call_id": call.call_id,
        "pid": os.getpid(),
    }


@tool(idempotent=True, queue="idem")
def idem_count(
    counter: str,
    seconds: float = 0.0,
    ratio: float = 0.0,
    seat: Seat | None = None,
    marker: str | None = None,
) -> dict[str, Any]:
    """Count a run under the Redis key `counter`, wait `seconds`, and report the call.

    Args:
        counter: Redis key to INCR.
        seconds: How long to block after counting.
        ratio: A number that only takes part in the idempotency key.
        seat: A nested model that only takes part in the idempotency key.
        marker: Redis key to set to the running process's PID.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return _report(counter, runs)


@tool(idempotent=True, queue="idem")
def idem_fail(counter: str) -> None:
    """Count a run under `counter`, then raise IdemFailure (not cached).

    Args:
        counter: Redis key to INCR.
    """
    raise IdemFailure(f"run {_run(counter, None)} failed")


@tool(idempotent=True, queue="idem", cache_errors=True)
def idem_fail_cached(counter: str) -> None:
    """Count a run under `counter`, then raise IdemFailure (cached: repeats get it).

    Args:
        counter: Redis key to INCR.
    """
    raise IdemFailure(f"run {_run(counter, None)} failed")


@tool(idempotent=True, queue="idem_kill")
def idem_slow_alo(counter: str, seconds: float, marker: str | None = None) -> dict[str, Any]:
    """At-least-once: count a run, record the PID under `marker`, block `seconds`.

    Args:
        counter: Redis key to INCR.
        seconds: How long to block.
        marker: Redis key to set to the running process's PID.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return _report(counter, runs)


@tool(idempotent=True, delivery="at_most_once", queue="idem_kill")
def idem_slow_amo(counter: str, seconds: float, marker: str | None = None) -> dict[str, Any]:
    """At-most-once: count a run, record the PID under `marker`, block `seconds`.

    Args:
        counter: Redis key to INCR.
        seconds: How long to block.
        marker: Redis key to set to the running process's PID.
    """
    runs = _run(counter, marker)
    time.sleep(seconds)
    return _report(counter, runs)


@tool(idempotent=True, queue="idem_kill")
def book_flight_once(
    flight_id: str, passenger: str, seconds: float = 0.0, marker: str | None = None
) -> flights.Booking:
    """Book one seat like ``book_flight``, as an idempotent at-least-once tool.

    It records the PID under `marker` and blocks `seconds` before writing the booking,
    so a test can kill the worker between the start of the call and the side effect.

    Args:
        flight_id: The flight number, e.g. "BA117".
        passenger: The passenger's full name.
        seconds: How long to block before booking.
        marker: Redis key to set to the running process's PID.
    """
    if marker:
        _redis().set(marker, os.getpid(), ex=_KEY_TTL)
    time.sleep(seconds)
    call = current_call()
    row = flights._insert_booking(
        flights.ledger_path(_settings().data_dir),
        flight_id=flight_id,
        passenger=passenger,
        call_id=call.call_id,
        idempotency_key=call.idempotency_key,
    )
    return flights.Booking(
        booking_id=row["booking_id"],
        flight_id=row["flight_id"],
        passenger=row["passenger"],
        created_at=row["created_at"],
    )


@tool(queue="idem")
def plain_count(counter: str, seconds: float = 0.0) -> dict[str, Any]:
    """Not idempotent: count a run under `counter` every time, then wait `seconds`.

    Args:
        counter: Redis key to INCR.
        seconds: How long to block after counting.
    """
    runs = _run(counter, None)
    time.sleep(seconds)
    return _report(counter, runs)
