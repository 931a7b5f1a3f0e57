"""Fixtures of the worker-side tests: a private Redis and Celery's in-process worker.

toolexec's side of a call (replies, stored outcomes, running markers) goes to a private
``redis-server`` on a free port, stopped at the end of the session. Celery's side uses
kombu's in-memory broker, polled every 10 ms, and the worker is Celery's own embedded
one (``celery.contrib.pytest``'s ``celery_session_worker``: the solo pool in a thread of
this process), so a call reaches the task body within milliseconds.

pytest-celery 1.x loads ``celery.contrib.pytest`` through its ``celery`` entry point and
replaces only ``celery_worker`` with a docker-based fixture; these tests use the
session fixtures it leaves alone (``celery_session_app``, ``celery_session_worker``),
configured by overriding ``celery_config`` and ``celery_worker_parameters``.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.trace import reset_worker_optimizations, setup_worker_optimizations

from executor.registry import tool, unregister
from executor.seams.celery_tasks import register_tasks
from toolexec import RedisServer
from wire.settings import Settings

Register = Callable[..., str]

#: The in-process worker's node name (``self.request.hostname`` in the task).
WORKER_HOSTNAME = "toolexec-test@localhost"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a free port for the session; stopped by PID at the end."""
    with RedisServer(directory=tmp_path_factory.mktemp("worker-redis")) as server:
        yield server


@pytest.fixture(scope="session")
def settings(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """toolexec settings: replies and idempotency records on the private server."""
    return Settings.from_env(
        {
            "TOOLEXEC_BROKER_URL": "memory://",
            "TOOLEXEC_REDIS_URL": redis_server.url,
            "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("worker-data")),
            "TOOLEXEC_REPLY_TTL": "60",
            "TOOLEXEC_OUTCOME_TTL": "120",
            "TOOLEXEC_CLAIM_MARGIN": "5",
        }
    )


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the private server, closed after the test."""
    with redis.Redis.from_url(redis_server.url) as connection:
        yield connection


@pytest.fixture(scope="session")
def celery_config() -> Mapping[str, Any]:
    """Celery's test app: the memory broker polled every 10 ms, JSON, one message at a time.

    The memory broker's queues are global to the process, hence a queue of our own.
    The result backend only serves ``start_worker``'s ping; toolexec's tasks carry
    their own (:class:`executor.seams.backend.ReplyBackend`).
    """
    return {
        "broker_url": "memory://",
        "broker_transport_options": {"polling_interval": 0.01},
        "result_backend": "cache+memory://",
        "task_default_queue": f"toolexec-worker-tests-{uuid.uuid4().hex[:8]}",
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_prefetch_multiplier": 1,
        "worker_disable_rate_limits": True,
    }


@pytest.fixture(scope="session")
def celery_worker_parameters() -> Mapping[str, Any]:
    """The embedded worker's node name, known to the tests."""
    return {"hostname": WORKER_HOSTNAME}


@pytest.fixture(scope="session")
def celery_session_app(celery_session_app: Celery, settings: Settings) -> Iterator[Celery]:
    """Celery's session app with toolexec's two tasks, registered before its worker starts.

    ``celery worker`` sets up the tracer with its node name, which a task then reads as
    ``self.request.hostname``; the embedded worker does not (its tasks would see the
    machine's host name), so this does it as ``celery worker`` would.
    """
    register_tasks(celery_session_app, settings)
    setup_worker_optimizations(celery_session_app, WORKER_HOSTNAME)
    yield celery_session_app
    reset_worker_optimizations(celery_session_app)


@pytest.fixture
def register() -> Iterator[Register]:
    """Register ``func`` as a tool under a fresh name with ``options``; unregistered after."""
    names: list[str] = []

    def _register(func: Callable[..., Any], **options: Any) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        tool(name=name, **options)(func)
        names.append(name)
        return name

    yield _register
    for name in names:
        unregister(name)


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a process that stays alive during the test (killed by PID after it)."""
    proc = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def exited_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
