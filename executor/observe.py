"""What a worker observes of its calls, told once and fed to both of its readers.

The call path tells this module three things: an attempt of a tool starts
(:func:`attempt`), a tool runs (:func:`running`), an outcome is delivered
(:func:`delivered`). Each feeds the worker's views of its calls: the Prometheus
metrics at ``/metrics`` (:mod:`executor.metrics`, only when ``TOOLEXEC_METRICS_PORT`` is
set), the per-tool counts ``toolexec status`` reads from Redis (:mod:`executor.stats`)
and each run's event log that ``toolexec ui`` shows (:mod:`executor.runlog`). None
does I/O on the way of a call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from executor import metrics, runlog, stats
from executor.registry import get_tool
from wire.models import CallOutcome, CallRequest
from wire.settings import Settings

__all__ = ["attempt", "delivered", "running"]


def attempt(call: CallRequest, number: int) -> None:
    """A run of ``call``'s tool starts: attempt ``number`` (1 for the first; a later one
    is a retry, ``@tool(retries=...)``)."""
    if number > 1:
        stats.record_retry(call.tool)
    metrics.record_attempt(call.tool, number)
    runlog.attempt(call.call_id, number)


@contextmanager
def running(call: CallRequest, *, worker: str, settings: Settings) -> Iterator[None]:
    """The block runs ``call``'s tool on ``worker``: counted as running, and timed."""
    runlog.running(call, worker=worker, settings=settings)
    try:
        with metrics.observe_run(call.tool):
            yield
    except BaseException:
        runlog.forget(call.call_id)  # no outcome of this run will be delivered here
        raise


def delivered(call: CallRequest, outcome: CallOutcome, *, settings: Settings) -> None:
    """An outcome of ``call`` was delivered to its caller."""
    metrics.record_outcome(call.tool, outcome)
    stats.record(
        call.tool,
        outcome,
        redis_url=settings.redis_url,
        sentinel_master=settings.sentinel_master,
    )
    definition = get_tool(call.tool)
    log_arguments = definition is not None and definition.log_arguments
    runlog.ended(call, outcome, settings=settings, log_arguments=log_arguments)
