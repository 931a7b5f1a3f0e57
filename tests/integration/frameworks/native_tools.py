"""Tools for the tests of each framework's own approval and progress.

Workers import this module through ``TOOLEXEC_TOOL_MODULES`` (the framework worker of
``conftest.py``); the test process never needs to.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import redis

from executor import report_progress, tool
from executor.worker import redis_client
from wire.settings import Settings

#: Seconds the counters live.
_KEY_TTL = 300


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())  # this process's client (made again after a fork)


@tool(requires_approval=True)
def approved_count(counter: str) -> dict[str, int]:
    """Count this execution under `counter`; a person approves each call first.

    Args:
        counter: The Redis key that counts the executions.
    """
    pipe = _redis().pipeline(transaction=False)
    pipe.incr(counter)
    pipe.expire(counter, _KEY_TTL)
    runs, _ = pipe.execute()
    return {"runs": int(runs)}


@tool
def progress_steps(steps: int, pause: float = 0.0) -> dict[str, Any]:
    """Report `steps` steps of progress, `pause` seconds apart, then return.

    Args:
        steps: How many steps to report.
        pause: Seconds after each step.
    """
    for step in range(1, steps + 1):
        report_progress(step, steps, f"step {step}")
        if pause:
            time.sleep(pause)
    return {"steps": steps}
