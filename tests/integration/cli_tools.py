"""Tools the ``toolexec`` command's tests load into the worker ``toolexec worker`` starts.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Every tool is on the ``cli`` queue, which only the worker of
``tests/integration/test_cli.py`` consumes, except ``cli_idle``: its queue ``cli-idle``
is consumed by no worker, so the tests can fill it and read its depth.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from typing import Any

import redis

from executor import current_call, report_progress, tool
from executor.worker import redis_client
from wire.settings import Settings

#: The queue of every tool here but ``cli_idle``.
QUEUE = "cli"
#: The queue nobody consumes.
IDLE_QUEUE = "cli-idle"
#: Seconds a tool's Redis keys live.
_KEY_TTL = 120


@functools.cache
def _settings() -> Settings:
    return Settings.from_env()


def _redis() -> redis.Redis:
    return redis_client(_settings())


@tool(queue=QUEUE, idempotent=True, timeout=30)
def cli_echo(text: str, number: int = 0, flags: list[bool] | None = None) -> dict[str, Any]:
    """Describe the arguments received: the text (when short), its length and hash.

    Args:
        text: Any text, up to the settings' argument limit.
        number: Any integer.
        flags: Any list of booleans, or null.
    """
    return {
        "text": text if len(text) <= 1000 else None,
        "length": len(text),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "number": number,
        "flags": flags,
        "run_id": current_call().run_id,
        "pid": os.getpid(),
    }


@tool(queue=QUEUE)
def cli_fail(message: str) -> None:
    """Raise ValueError with `message`.

    Args:
        message: The exception's message.
    """
    raise ValueError(message)


@tool(queue=QUEUE)
def cli_sleep(seconds: float, marker: str | None = None) -> dict[str, Any]:
    """Store this process's PID under the Redis key `marker`, then block for `seconds`.

    Args:
        seconds: How long to block.
        marker: A Redis key to set to the PID of the process running the call.
    """
    if marker:
        _redis().set(marker, os.getpid(), ex=_KEY_TTL)
    time.sleep(seconds)
    return {"slept": seconds, "pid": os.getpid()}


@tool(queue=QUEUE, hard_timeout=0.5)
def cli_hard(seconds: float) -> dict[str, Any]:
    """Block for `seconds`, past the tool's hard limit of 0.5 s.

    Args:
        seconds: How long to block.
    """
    time.sleep(seconds)
    return {"slept": seconds}


@tool(queue=QUEUE)
def cli_steps(steps: int, pause: float = 0.0) -> dict[str, Any]:
    """Report progress `steps` times, `pause` seconds apart, then return.

    Args:
        steps: How many steps to report.
        pause: Seconds between two steps.
    """
    for step in range(1, steps + 1):
        report_progress(step, steps, f"step {step} of {steps}")
        time.sleep(pause)
    return {"steps": steps}


@tool(queue=QUEUE, requires_approval=True)
def cli_approved(text: str) -> str:
    """Return `text`; a person approves each call first.

    Args:
        text: What to return.
    """
    return text


@tool(queue=IDLE_QUEUE)
def cli_idle() -> None:
    """Do nothing; no worker consumes this tool's queue."""
