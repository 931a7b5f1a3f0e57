"""A worker's Prometheus metrics, served at ``/metrics`` when ``TOOLEXEC_METRICS_PORT`` is set.

Every metric carries a ``tool`` label (a name no registered tool has is counted as
``_unregistered``, so a stray message cannot add series):

* ``toolexec_calls_total``: calls this worker answered: ran, refused as expired, or
  reported lost (a pool child died, Celery's time limit ended it).
* ``toolexec_errors_total`` (also ``kind``: ``execution``, ``invalid_arguments``,
  ``not_found``, ``hard_timeout``, ``expired``, ``worker_lost``): the calls that failed.
* ``toolexec_hard_timeouts_total``: calls stopped or abandoned at their hard limit.
* ``toolexec_sheds_total``: calls refused because their deadline passed before they started.
* ``toolexec_attempts_total``: runs of the tool, the first of each call and each retry
  (``@tool(retries=...)``, :mod:`executor.retries`).
* ``toolexec_retries_total``: the runs that were retries.
* ``toolexec_call_duration_seconds``: a histogram of how long the tool ran (for a call
  retried, every attempt and the pauses between them).
* ``toolexec_calls_running``: calls running now.

Prefork children write their values to files in a directory of this worker's own
(``PROMETHEUS_MULTIPROC_DIR``, made empty at start and removed at shutdown: the
``prometheus-client`` multiprocess mode); the main process merges them when scraped.
The running-calls gauge of a child that has exited is dropped at the next scrape, or
when the child shuts down normally (``worker_process_shutdown``). The directory
must exist before the pool forks, so the worker sets it up at ``worker_init`` and
serves at ``worker_ready`` (:mod:`executor.seams.app` connects the hooks below to
Celery's signals); without ``TOOLEXEC_METRICS_PORT`` nothing is collected and each hook
returns at once. ``prometheus_client`` is imported only then, after the directory is
set, as its multiprocess mode requires.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from executor.registry import get_tool
from executor.worker import pid_alive
from wire.models import CallOutcome, ErrorKind
from wire.settings import Settings, set_environment_variable

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

__all__ = [
    "enable_metrics",
    "observe_run",
    "record_attempt",
    "record_outcome",
    "start_metrics_server",
    "stop_metrics_server",
    # The worker's hooks
    "on_process_shutdown",
    "on_worker_init",
    "on_worker_ready",
    "on_worker_shutdown",
]

logger = logging.getLogger(__name__)

#: Buckets of the latency histogram, in seconds: tools run from milliseconds to minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
#: The ``tool`` label of a call whose tool this worker does not have.
UNREGISTERED = "_unregistered"


@dataclass(frozen=True)
class _Metrics:
    directory: str
    calls: Counter
    errors: Counter
    hard_timeouts: Counter
    sheds: Counter
    attempts: Counter
    retries: Counter
    duration: Histogram
    running: Gauge


_lock = threading.Lock()
_metrics: _Metrics | None = None
_server: Any = None


def enable_metrics() -> str:
    """Start collecting in this process and the pool children it forks; return the directory.

    Idempotent. Sets ``PROMETHEUS_MULTIPROC_DIR`` to a fresh, empty directory of this
    worker's own before ``prometheus_client`` makes any value.
    """
    global _metrics
    with _lock:
        if _metrics is not None:
            return _metrics.directory
        directory = tempfile.mkdtemp(prefix=f"toolexec-metrics-{os.getpid()}-")
        set_environment_variable("PROMETHEUS_MULTIPROC_DIR", directory)  # read by prometheus_client
        from prometheus_client import Counter, Gauge, Histogram, values

        # The value class is chosen when prometheus_client is first imported; if
        # something imported it before the directory was set, choose again.
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        tool, kind = ("tool",), ("tool", "kind")
        _metrics = _Metrics(
            directory=directory,
            calls=Counter("toolexec_calls", "Calls this worker answered.", tool, registry=None),
            errors=Counter(
                "toolexec_errors", "Calls that failed, by error kind.", kind, registry=None
            ),
            hard_timeouts=Counter(
                "toolexec_hard_timeouts", "Calls stopped at their hard limit.", tool, registry=None
            ),
            sheds=Counter("toolexec_sheds", "Calls refused as expired.", tool, registry=None),
            attempts=Counter(
                "toolexec_attempts", "Runs of the tool, retries included.", tool, registry=None
            ),
            retries=Counter(
                "toolexec_retries", "Runs of the tool that retried a call.", tool, registry=None
            ),
            duration=Histogram(
                "toolexec_call_duration_seconds",
                "How long the tool ran.",
                tool,
                registry=None,
                buckets=DURATION_BUCKETS,
            ),
            running=Gauge(
                "toolexec_calls_running",
                "Calls running now.",
                tool,
                registry=None,
                multiprocess_mode="livesum",
            ),
        )
        return directory


def _label(tool: str) -> str:
    return tool if get_tool(tool) is not None else UNREGISTERED


def record_outcome(tool: str, outcome: CallOutcome) -> None:
    """Count an outcome this worker delivered (a no-op unless metrics are on)."""
    metrics = _metrics
    if metrics is None:
        return
    label = _label(tool)
    metrics.calls.labels(label).inc()
    error = outcome.error
    if error is None:
        return
    metrics.errors.labels(label, error.kind.value).inc()
    if error.kind is ErrorKind.HARD_TIMEOUT:
        metrics.hard_timeouts.labels(label).inc()
    elif error.kind is ErrorKind.EXPIRED:
        metrics.sheds.labels(label).inc()


def record_attempt(tool: str, attempt: int) -> None:
    """Count a run of ``tool`` that starts: attempt ``attempt`` of its call (1 for the first)."""
    metrics = _metrics
    if metrics is None:
        return
    label = _label(tool)
    metrics.attempts.labels(label).inc()
    if attempt > 1:
        metrics.retries.labels(label).inc()


@contextlib.contextmanager
def observe_run(tool: str) -> Iterator[None]:
    """Count the block as a running call of ``tool`` and time it (a no-op unless metrics are on)."""
    metrics = _metrics
    if metrics is None:
        yield
        return
    label = _label(tool)
    running = metrics.running.labels(label)
    running.inc()
    started = time.perf_counter()
    try:
        yield
    finally:
        metrics.duration.labels(label).observe(time.perf_counter() - started)
        running.dec()


def start_metrics_server(port: int, host: str = "127.0.0.1") -> None:
    """Serve the merged metrics of this worker's processes at ``http://host:port/metrics``.

    Call it in the worker's main process; it enables collecting if it is not on yet.

    Raises:
        OSError: The port cannot be bound.
    """
    global _server
    directory = enable_metrics()
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(cast("Collector", _LiveCollector(directory)))
    with _lock:
        if _server is not None:
            return
        _server, _ = start_http_server(port, addr=host, registry=registry)
    logger.info("serving metrics at http://%s:%d/metrics", host, port)


def stop_metrics_server() -> None:
    """Stop serving, stop collecting, and remove the directory of values."""
    global _server, _metrics
    with _lock:
        server, _server = _server, None
        metrics, _metrics = _metrics, None
    if server is not None:
        server.shutdown()
        server.server_close()
    if metrics is not None:
        shutil.rmtree(metrics.directory, ignore_errors=True)


class _LiveCollector:
    """prometheus_client's multiprocess collector, less the gauges of exited processes."""

    def __init__(self, directory: str) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self._directory = directory
        self._merged: Any = MultiProcessCollector(None, path=directory)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.multiprocess import mark_process_dead

        for pid in _pids_with_live_gauges(self._directory):
            if not pid_alive(pid):
                mark_process_dead(pid, self._directory)  # type: ignore[no-untyped-call]
        metrics: Iterable[Metric] = self._merged.collect()
        return metrics


def _pids_with_live_gauges(directory: str) -> set[int]:
    pids = set()
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        tail = os.path.basename(path).rsplit("_", 1)[-1].removesuffix(".db")
        if tail.isdigit():
            pids.add(int(tail))
    return pids


# -- the worker's hooks (connected to Celery's signals by executor.seams.app) ------------


def _settings_of(app: Any) -> Settings | None:
    settings = getattr(app, "toolexec_settings", None)
    return settings if isinstance(settings, Settings) else None


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """``worker_init``: enable collecting, before the pool forks (its children inherit
    the directory)."""
    settings = _settings_of(getattr(sender, "app", None))
    if settings is not None and settings.metrics_port is not None:
        enable_metrics()


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """``worker_ready``: serve ``/metrics`` on ``TOOLEXEC_METRICS_PORT``."""
    settings = _settings_of(getattr(sender, "app", None))
    if settings is None or settings.metrics_port is None:
        return
    try:
        start_metrics_server(settings.metrics_port, settings.metrics_host)
    except OSError as exc:
        logger.error(
            "cannot serve metrics on %s port %d: %s",
            settings.metrics_host,
            settings.metrics_port,
            exc,
        )


def on_process_shutdown(pid: int | None = None, **_: Any) -> None:
    """``worker_process_shutdown``: drop the running-calls gauge of the pool child ``pid``."""
    metrics = _metrics
    if metrics is not None and pid:
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(pid, metrics.directory)  # type: ignore[no-untyped-call]


def on_worker_shutdown(**_: Any) -> None:
    """``worker_shutdown``: stop serving and remove the directory of values."""
    if _metrics is not None:
        stop_metrics_server()
