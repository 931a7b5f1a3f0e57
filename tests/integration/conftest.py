"""Fixtures that start a private Redis server and real Celery workers.

Nothing here touches the machine's Redis on 6379: the session gets its own server on a
free port, and every worker started through :func:`worker_factory` is stopped by PID
when its test ends.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import pytest
import redis

from agent_client import ToolClient, configure
from toolexec import Pool, RedisServer, WorkerProcess
from wire import keys
from wire.connect import sync_client
from wire.settings import Settings

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class WorkerFactory(Protocol):
    """Starts a worker for the current test; the fixture stops it at teardown."""

    def __call__(
        self,
        *,
        pool: Pool = "prefork",
        concurrency: int = 2,
        queues: Sequence[str] = ("default",),
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = 30.0,
    ) -> WorkerProcess: ...


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private Redis server on a free port, for the whole session."""
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def settings_env(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """``TOOLEXEC_*`` variables pointing at the private server; treat as read-only."""
    return {
        "TOOLEXEC_BROKER_URL": redis_server.url,
        "TOOLEXEC_REDIS_URL": redis_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
    }


@pytest.fixture(scope="session")
def settings(settings_env: dict[str, str]) -> Settings:
    """The settings a worker started with :data:`settings_env` sees."""
    return Settings.from_env(settings_env)


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the private server, closed after the test."""
    with redis.Redis.from_url(redis_server.url) as client:
        yield client


@pytest.fixture
def flush_redis(redis_server: RedisServer) -> Iterator[Callable[[], None]]:
    """Empty the private server before the test; call the value to empty it again.

    Workers of the session lose their heartbeat too; they publish it again within
    ``TOOLEXEC_HEARTBEAT_INTERVAL``.
    """

    def flush() -> None:
        with redis.Redis.from_url(redis_server.url) as client:
            client.flushall()

    flush()
    yield flush


@pytest.fixture
def worker_factory(settings_env: dict[str, str], tmp_path: Path) -> Iterator[WorkerFactory]:
    """Start real ``celery -A executor worker`` processes; all are stopped at teardown."""
    numbers = itertools.count(1)

    def start(
        *,
        pool: Pool = "prefork",
        concurrency: int = 2,
        queues: Sequence[str] = ("default",),
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = 30.0,
    ) -> WorkerProcess:
        worker = WorkerProcess(
            name=name or f"w{next(numbers)}-{uuid.uuid4().hex[:8]}",
            pool=pool,
            concurrency=concurrency,
            queues=queues,
            env={**settings_env, **(env or {})},
            cwd=PROJECT_ROOT,
            log_dir=tmp_path / "workers",
        )
        stack.callback(stop_quickly, worker)
        return worker.start(wait=wait, timeout=timeout)

    with contextlib.ExitStack() as stack:
        yield start


#: Seconds a test's worker has to stop at teardown before it is killed: a warm stop of an
#: idle worker takes one or two, and what a test left running is of no interest by then.
TEARDOWN_GRACE = 2.0


def stop_quickly(worker: WorkerProcess) -> None:
    """Stop ``worker`` at a test's end: SIGTERM, SIGKILL after :data:`TEARDOWN_GRACE`.

    A worker killed before it could leave the catalog is taken out of it here, as its warm
    stop would have, so the next test sees no worker that is not there.
    """
    info = worker.info
    worker.stop(timeout=TEARDOWN_GRACE)
    if info is None:
        return
    with (
        contextlib.suppress(redis.RedisError),
        sync_client(
            worker.settings.redis_url,
            master=worker.settings.sentinel_master,
            socket_connect_timeout=1,
            socket_timeout=2,
        ) as client,
    ):
        pipe = client.pipeline(transaction=False)
        pipe.delete(keys.worker(info.worker_id))
        pipe.srem(keys.WORKERS, info.worker_id)
        pipe.execute()


# -- probe tools, the session's probe worker and the agent's client -------------------

#: Tool modules of a worker that serves the starter tools and the test probes.
PROBE_TOOL_MODULES = "tasks,tests.integration.probe_tools"


@pytest.fixture(scope="session")
def probe_env(settings_env: dict[str, str]) -> dict[str, str]:
    """:data:`settings_env` plus the probe tools (``tests/integration/probe_tools.py``)."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": PROBE_TOOL_MODULES}


@pytest.fixture(scope="module")
def probe_worker(
    probe_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One prefork worker (concurrency 4) on ``default`` with the probes, per test module.

    Not session-wide: every worker on a queue must serve the same tools, and other
    modules run their own workers, with other tool modules, on ``default``. Tests may
    kill one of its pool children (Celery replaces it), never the worker.
    """
    worker = WorkerProcess(
        name=f"probe-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=4,
        env=probe_env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("probe-worker"),
    )
    with worker:
        yield worker


@pytest.fixture(scope="module")
def tool_client(probe_env: dict[str, str]) -> Iterator[ToolClient]:
    """This process's agent client, configured for the private server, per test module.

    Module-scoped because closing a client waits up to a second for its reply listener.
    """
    client = configure(Settings.from_env(probe_env))
    yield client
    client.close()


# -- a Redis of a test's own, for the outage tests (test_redis_outage, test_frozen_redis) --


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own that keeps its data across a restart (AOF).

    It is never left frozen: it gets ``SIGCONT`` before it is stopped.
    """
    with RedisServer(directory=tmp_path / "own-redis", appendonly=True) as server:
        yield server
        if server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signal.SIGCONT)


@pytest.fixture
def own_env(own_server: RedisServer, probe_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """Settings of the test's worker and client: the probe tools, on ``own_server``."""
    return {
        **probe_env,
        "TOOLEXEC_BROKER_URL": own_server.url,
        "TOOLEXEC_REDIS_URL": own_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
    }


@pytest.fixture
def own_client(own_env: dict[str, str]) -> Iterator[ToolClient]:
    """A client of ``own_server``, closed after the test."""
    client = ToolClient(Settings.from_env(own_env))
    yield client
    client.close()


@pytest.fixture
def own_store(own_server: RedisServer) -> Iterator[redis.Redis]:
    """The test's own connection to ``own_server`` (for counters and stats)."""
    with redis.Redis.from_url(own_server.url) as connection:
        yield connection


# -- a fleet of the deploy tools on a Redis of the test's own (test_deploy_*, test_outage_memory,
# test_connection_drops, test_lost_processes, test_stalls_and_dead_callers) ------------


@pytest.fixture
def fleet_env(own_server: RedisServer, tmp_path: Path) -> dict[str, str]:
    """Worker and client settings for ``own_server`` with the deploy tools (deploy_support)."""
    from tests.integration.deploy_support import deploy_env

    return deploy_env(own_server, tmp_path / "data")


@pytest.fixture
def fleet_client(fleet_env: dict[str, str]) -> Iterator[ToolClient]:
    """A client of :func:`fleet_env`'s Redis, closed after the test."""
    client = ToolClient(Settings.from_env(fleet_env))
    yield client
    client.close()
