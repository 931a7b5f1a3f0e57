"""Fixtures of the contract tests: a private Redis server, real workers, a stock producer.

The contract tests check toolexec's hand-written Celery message against what stock
Celery writes and reads on the pinned versions. Everything runs against a private
``redis-server`` on a free port; every process started here is stopped by PID at
teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from agent_client import ToolClient, configure
from tests.integration.workers import module_worker
from toolexec import RedisServer, WorkerProcess
from wire.settings import Settings

from .support import EventsWorker

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def contract_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private Redis server on a free port, for the whole session."""
    with RedisServer(directory=tmp_path_factory.mktemp("contract-redis")) as server:
        yield server


@pytest.fixture(scope="session")
def contract_env(
    contract_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """``TOOLEXEC_*`` variables of workers and clients: the private server, the starter tools."""
    return {
        "TOOLEXEC_BROKER_URL": contract_redis.url,
        "TOOLEXEC_REDIS_URL": contract_redis.url,
        "TOOLEXEC_TOOL_MODULES": "tasks",
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("contract-data")),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
    }


@pytest.fixture(scope="session")
def contract_settings(contract_env: dict[str, str]) -> Settings:
    """The settings the workers and the client see."""
    return Settings.from_env(contract_env)


@pytest.fixture
def redis_client(contract_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of the private server, closed after the test."""
    with redis.Redis.from_url(contract_redis.url) as client:
        yield client


@pytest.fixture(scope="session")
def producer(contract_redis: RedisServer) -> Iterator[Celery]:
    """A stock Celery app on the private broker: the other side of every comparison."""
    app = Celery("contract-producer", broker=contract_redis.url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    yield app
    app.close()


@pytest.fixture(scope="module")
def agent(contract_settings: Settings) -> Iterator[ToolClient]:
    """This process's agent client (``configure``), for one test module."""
    client = configure(contract_settings)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stock_worker(
    contract_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """``celery -A executor worker`` as toolexec launches it, on ``default``, per module."""
    with module_worker(tmp_path_factory, "contract", env=contract_env) as worker:
        yield worker


@pytest.fixture(scope="module")
def events_worker(
    contract_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The same worker with task events on (``-E``), on ``default``, per module.

    Module-scoped like :func:`stock_worker`, so the two never consume ``default`` at the
    same time: a call reaches the worker the test watches.
    """
    with module_worker(
        tmp_path_factory, "contract-events", env=contract_env, kind=EventsWorker
    ) as worker:
        yield worker
