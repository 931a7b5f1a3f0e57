"""Plain Celery, the way its documentation sets it up: the benchmark's comparison.

The same broker as toolexec, a Redis result backend on the same server, JSON only, and
Celery's own defaults for everything else (prefetch, acknowledgements, result
consumer). ``celery -A bench.raw_celery worker`` runs it; the benchmark's client side
builds its own app with :func:`create_app`.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from celery import Celery

from bench import names
from wire.settings import Settings

__all__ = ["NOOP", "SHED_BUSY", "SHED_MARK", "SLEEP_MS", "create_app"]

NOOP = "bench.noop"
SLEEP_MS = "bench.sleep_ms"
SHED_BUSY = "bench.shed_busy"
SHED_MARK = "bench.shed_mark"


def create_app(settings: Settings, queue: str = names.RAW_QUEUE) -> Celery:
    """A plain Celery app on ``settings``' broker with a Redis result backend, sending
    to ``queue``."""
    app = Celery("bench_raw", set_as_current=False)
    app.conf.update(
        broker_url=settings.broker_url,
        result_backend=settings.redis_url,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_default_queue=queue,
        worker_hijack_root_logger=False,
    )

    @app.task(name=NOOP)  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    @app.task(name=SLEEP_MS)  # type: ignore[untyped-decorator]
    def sleep_ms(ms: int) -> int:
        time.sleep(ms / 1000)
        return ms

    @app.task(name=SHED_BUSY)  # type: ignore[untyped-decorator]
    def shed_busy(ms: int) -> int:
        client = _redis(app)
        client.set(names.SHED_BUSY, "1", px=ms + 1000)
        try:
            time.sleep(ms / 1000)
        finally:
            client.delete(names.SHED_BUSY)
        return ms

    @app.task(name=SHED_MARK)  # type: ignore[untyped-decorator]
    def shed_mark() -> None:
        _redis(app).incr(names.SHED_RAN_RAW)

    return app


def _redis(app: Celery) -> Any:
    # The result backend's own Redis connection: the tasks need no other.
    return app.backend.client


@functools.cache
def _worker_app() -> Celery:
    return create_app(Settings.from_env())


def __getattr__(name: str) -> Any:
    # ``celery -A bench.raw_celery`` looks up ``app``; build it only then, so that
    # importing this module on the client side reads no environment.
    if name == "app":
        return _worker_app()
    raise AttributeError(f"module 'bench.raw_celery' has no attribute {name!r}")
