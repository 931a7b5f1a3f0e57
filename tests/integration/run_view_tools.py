"""Tools the run view tests (``toolexec ui``, the run log) load into real workers.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Every tool is on the ``runview`` queue, which only these tests' workers
consume.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from executor import report_progress, tool
from executor.worker import redis_client
from wire.settings import Settings

#: The queue of every tool here.
QUEUE = "runview"


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


@tool(queue=QUEUE)
def rv_double(x: int) -> int:
    """Return twice `x`."""
    return 2 * x


@tool(queue=QUEUE)
def rv_fail(message: str) -> None:
    """Raise ValueError with `message`."""
    raise ValueError(message)


@tool(queue=QUEUE)
def rv_sleep(seconds: float) -> float:
    """Sleep `seconds`, then return them."""
    time.sleep(seconds)
    return seconds


@tool(queue=QUEUE, idempotent=True)
def rv_book(seat: str, counter: str) -> dict[str, Any]:
    """Book `seat` once per run; each run of the tool adds one to the Redis key `counter`."""
    runs = redis_client(_settings()).incr(counter)
    redis_client(_settings()).expire(counter, 300)
    return {"seat": seat, "runs": int(runs)}


@tool(queue=QUEUE)
def rv_steps(steps: int, pause: float) -> int:
    """Report progress `steps` times, `pause` seconds apart."""
    for step in range(1, steps + 1):
        report_progress(step, steps)
        time.sleep(pause)
    return steps


@tool(queue=QUEUE, log_arguments=True)
def rv_logged(text: str) -> dict[str, str]:
    """Echo `text` (its arguments and result go into the run log)."""
    return {"echo": text}


@tool(queue=QUEUE, retries=2, retry_on=(RuntimeError,), retry_backoff=0.05)
def rv_flaky(counter: str, fail_times: int) -> int:
    """Fail with RuntimeError the first `fail_times` runs counted in Redis key `counter`."""
    runs = int(redis_client(_settings()).incr(counter))
    redis_client(_settings()).expire(counter, 300)
    if runs <= fail_times:
        raise RuntimeError(f"run {runs} fails")
    return runs


@tool(queue=QUEUE, idempotent=True)
def rv_slow_book(seat: str, seconds: float) -> str:
    """Book `seat` after `seconds` (at least once: sent again if its worker dies)."""
    time.sleep(seconds)
    return seat
