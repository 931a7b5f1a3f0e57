"""What a worker observes of its calls, told once and fed to both of its readers.

The call path tells this module three things: an attempt of a tool starts
(:func:`attempt`), a tool runs (:func:`running`), an outcome is delivered
(:func:`delivered`). Each feeds both of the worker's views of its calls: the Prometheus
metrics at ``/metrics`` (:mod:`executor.metrics`, only when ``TOOLEXEC_METRICS_PORT`` is
set) and the per-tool counts ``toolexec status`` reads from Redis
(:mod:`executor.stats`). Neither does I/O on the way of a call.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from executor import metrics, stats
from wire.models import CallOutcome

__all__ = ["attempt", "delivered", "running"]


def attempt(tool: str, number: int) -> None:
    """A run of ``tool`` starts: attempt ``number`` of its call (1 for the first; a later
    one is a retry, ``@tool(retries=...)``)."""
    if number > 1:
        stats.record_retry(tool)
    metrics.record_attempt(tool, number)


def running(tool: str) -> AbstractContextManager[None]:
    """The block runs ``tool``: counted as running, and timed."""
    return metrics.observe_run(tool)


def delivered(
    tool: str, outcome: CallOutcome, *, redis_url: str, sentinel_master: str | None = None
) -> None:
    """An outcome of ``tool`` was delivered to its caller (``redis_url``, and the group a
    ``sentinel://`` one names: where a prefork child flushes its counts)."""
    metrics.record_outcome(tool, outcome)
    stats.record(tool, outcome, redis_url=redis_url, sentinel_master=sentinel_master)
