"""Tools that fail and retry (``@tool(retries=...)``), for ``test_retries.py``.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
does. Every tool counts its runs in Redis under the key its caller names (``INCR``), so a
test counts the attempts whichever process of the worker made them. All are on the
``retries`` queue, which only that test's worker consumes.
"""

from __future__ import annotations

import asyncio
import functools
import time

import redis

from executor import tool
from executor.worker import redis_client
from wire.settings import Settings

QUEUE = "retries"

#: Seconds a run counter lives; long enough for any test.
_KEY_TTL = 120


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _run(key: str) -> int:
    """Count one more run under ``key``; the number of this run (1 for the first)."""
    client: redis.Redis = redis_client(_settings())
    pipe = client.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, _KEY_TTL)
    runs, _ = pipe.execute()
    return int(runs)


@tool(queue=QUEUE, retries=3, retry_on=(ConnectionError,), retry_backoff=0.05)
def retry_flaky(key: str, failures: int) -> int:
    """Raise ConnectionError on the first `failures` runs under `key`, then return the run's number.

    Args:
        key: The Redis key that counts the runs.
        failures: How many runs fail.
    """
    run = _run(key)
    if run <= failures:
        raise ConnectionError(f"the service is down (run {run})")
    return run


@tool(queue=QUEUE, retries=3, retry_on=(ConnectionError,), retry_backoff=0.05)
async def retry_flaky_async(key: str, failures: int) -> int:
    """`retry_flaky` as an ``async def`` tool.

    Args:
        key: The Redis key that counts the runs.
        failures: How many runs fail.
    """
    await asyncio.sleep(0)
    run = _run(key)
    if run <= failures:
        raise ConnectionError(f"the service is down (run {run})")
    return run


@tool(queue=QUEUE, retries=3, retry_on=(ConnectionError,), retry_backoff=0.05)
def retry_wrong(key: str) -> int:
    """Raise ValueError, which this at-most-once tool does not retry.

    Args:
        key: The Redis key that counts the runs.
    """
    raise ValueError(f"not retried (run {_run(key)})")


@tool(queue=QUEUE, retries=5, retry_on=(ConnectionError,), retry_backoff=2.0)
def retry_down(key: str) -> int:
    """Always raise ConnectionError; the pauses (1-2 s, then 2-4 s) soon outrun a deadline.

    Args:
        key: The Redis key that counts the runs.
    """
    raise ConnectionError(f"the service is down (run {_run(key)})")


@tool(queue=QUEUE, retries=2, retry_on=(ConnectionError,), retry_backoff=0.6, hard_timeout=0.45)
def retry_bounded(key: str) -> int:
    """Take 0.35 s and fail twice, then succeed: its attempts and pauses outlast one hard
    limit plus Celery's margin, which Celery's own limit must allow for on prefork.

    Args:
        key: The Redis key that counts the runs.
    """
    time.sleep(0.35)
    run = _run(key)
    if run <= 2:
        raise ConnectionError(f"the service is down (run {run})")
    return run
