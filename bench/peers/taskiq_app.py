"""taskiq with taskiq-redis as their README sets them up: a stream broker, Redis results.

``python -m taskiq worker bench.peers.taskiq_app:broker`` runs the worker
(:func:`worker_argv`): taskiq's own command, whose main process manages the worker
processes. ``broker`` is built from the workers' environment when the command looks it
up; :class:`Client` builds one of its own, sends with ``kiq()`` and waits with
``wait_result(check_interval=)``, which polls the result key (see
:func:`bench.peers.calls.result_poll`).

The broker is taskiq-redis's ``RedisStreamBroker``, the README's example and its broker
with acknowledgements (``ListQueueBroker`` has none), and the results
``RedisAsyncResultBackend`` with an expiry, which the README strongly recommends.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Coroutine
from importlib import metadata
from typing import Any, TypeAlias

from taskiq import AsyncBroker, AsyncTaskiqDecoratedTask
from taskiq.exceptions import TaskiqResultTimeoutError
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from bench import names
from bench.peers.calls import result_poll
from wire.settings import Settings

__all__ = [
    "MAX_ASYNC_TASKS",
    "STOP_TIMEOUT",
    "TASK",
    "WORKERS",
    "Client",
    "create",
    "describe",
    "worker_argv",
]

#: Worker processes and tasks each runs at once: taskiq's defaults, stated explicitly.
WORKERS = 2
MAX_ASYNC_TASKS = 100
#: Seconds the harness gives the worker to exit on SIGTERM before it kills the group:
#: taskiq 0.13's workers, told to stop, wait for the stream read in progress to deliver
#: a message (taskiq-redis reads again on each empty XREADGROUP), so an idle worker
#: never exits by itself. Past its manager's one-second tick, nothing is left to do.
STOP_TIMEOUT = 2.0
#: The no-op's task name.
TASK = "bench_noop"
#: The no-op as taskiq registers it.
_Noop: TypeAlias = "AsyncTaskiqDecoratedTask[[], Coroutine[Any, Any, None]]"
#: How long a result is kept, in milliseconds.
_RESULT_PX = 600_000


async def _noop() -> None:
    return None


def create(url: str) -> tuple[AsyncBroker, _Noop]:
    """A broker on ``url`` with the result backend, and the no-op task registered on it."""
    backend: RedisAsyncResultBackend[Any] = RedisAsyncResultBackend(
        redis_url=url, result_px_time=_RESULT_PX, prefix_str=names.TASKIQ_RESULTS
    )
    broker = RedisStreamBroker(url=url, queue_name=names.TASKIQ_STREAM).with_result_backend(backend)
    task = broker.register_task(_noop, task_name=TASK)
    return broker, task


@functools.cache
def _worker_broker() -> AsyncBroker:
    return create(Settings.from_env().redis_url)[0]


def __getattr__(name: str) -> Any:
    # taskiq's command looks ``broker`` up; build it only then, from the environment.
    if name == "broker":
        return _worker_broker()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def worker_argv() -> list[str]:
    """The worker's command line (``--log-level WARNING``: it logs every task at INFO)."""
    return [
        sys.executable,
        "-m",
        "taskiq",
        "worker",
        f"{__name__}:broker",
        "--workers",
        str(WORKERS),
        "--max-async-tasks",
        str(MAX_ASYNC_TASKS),
        "--log-level",
        "WARNING",
    ]


def describe() -> tuple[str, str, str]:
    """Label, worker and client as scenario 11 states them."""
    return (
        f"taskiq {metadata.version('taskiq')}",
        (
            f"`taskiq worker --workers {WORKERS} --max-async-tasks {MAX_ASYNC_TASKS}` (its "
            f"defaults), taskiq-redis {metadata.version('taskiq-redis')} RedisStreamBroker "
            "(acknowledged), RedisAsyncResultBackend (result_px_time), log level WARNING"
        ),
        (
            "`task.kiq()`; N coroutines; `wait_result(check_interval=)`: "
            f"{result_poll(1) * 1000:g} ms at 1, {result_poll(100) * 1000:g} ms at 100, "
            f"{result_poll(1000) * 1000:g} ms at 1,000 in flight"
        ),
    )


class Client:
    """The benchmark's taskiq client: its own broker, started on the benchmark's loop."""

    def __init__(self, broker: AsyncBroker, task: _Noop) -> None:
        self._broker = broker
        self._task = task

    @classmethod
    async def open(cls, url: str) -> Client:
        """Start a client broker (it declares the stream's consumer group, as workers do)."""
        broker, task = create(url)
        await broker.startup()
        return cls(broker, task)

    async def call(self, poll: float, timeout: float) -> object:
        """Send the no-op and wait for its result, polling every ``poll`` seconds.

        Raises:
            TimeoutError: No result within ``timeout`` seconds.
        """
        sent = await self._task.kiq()
        try:
            result = await sent.wait_result(check_interval=poll, timeout=timeout)
        except TaskiqResultTimeoutError as exc:  # as arq's and the others': a TimeoutError
            raise TimeoutError(f"no taskiq result within {timeout}s") from exc
        result.raise_for_error()
        return result.return_value

    async def aclose(self) -> None:
        """Shut the client broker down (its connection pools too)."""
        await self._broker.shutdown()
