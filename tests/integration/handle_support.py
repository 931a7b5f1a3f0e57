"""Fixtures and helpers of the handle and cancel tests (``test_handles.py``,
``test_cancel.py``): a Redis of the module's own, a worker of each pool serving
``handle_tools.py``, and the record of what each tool did."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_client import ToolClient
from tests.integration.conftest import PROJECT_ROOT, stop_quickly
from toolexec.redis_server import RedisServer
from toolexec.worker_process import Pool, WorkerProcess
from wire.settings import Settings

MODULES = "tests.integration.handle_tools"
QUEUE = "handles"
POOLS: list[Pool] = ["prefork", "threads", "solo", "asyncio"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("handles-redis")) as redis_server:
        yield redis_server


@pytest.fixture(scope="module")
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "TOOLEXEC_BROKER_URL": server.url,
        "TOOLEXEC_REDIS_URL": server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("handles-data")),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
        "TOOLEXEC_TOOL_MODULES": MODULES,
    }


@pytest.fixture(scope="module", params=POOLS)
def worker(
    request: pytest.FixtureRequest, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    pool: Pool = request.param
    process = WorkerProcess(
        name=f"handles-{pool}-{uuid.uuid4().hex[:6]}",
        pool=pool,
        concurrency=2,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("handles-workers"),
    )
    process.start(wait=True, timeout=60)
    yield process
    stop_quickly(process)


@pytest.fixture(scope="module")
def client(env: dict[str, str]) -> Iterator[ToolClient]:
    tool_client = ToolClient(Settings.from_env(env))
    yield tool_client
    tool_client.close()


def runs(env: dict[str, str], token: str) -> list[str]:
    path = Path(env["TOOLEXEC_DATA_DIR"]) / "runs" / token
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def token() -> str:
    return uuid.uuid4().hex[:12]
