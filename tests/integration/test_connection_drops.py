"""Connections dropped or half-closed between the workers and Redis (a TCP proxy of the
test's own) run no at-least-once call twice, and tell nobody ``WorkerLost``.

Each worker puts back the calls it had taken but not started and keeps those it had
started (a started call is never put back when its connection closes,
``executor.seams.put_back``), which it finishes and answers once it reconnects.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent_client import ToolClient
from tests.integration.conftest import WorkerFactory
from tests.integration.deploy_support import Proxy, deploy_env, run_batch, start_fleet
from toolexec import Pool, RedisServer

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "asyncio"]


@pytest.mark.parametrize("half", [False, True], ids=["dropped", "half-closed"])
@pytest.mark.parametrize("pool", POOLS)
def test_connections_dropped_under_the_workers_run_no_at_least_once_call_twice(
    worker_factory: WorkerFactory,
    own_server: RedisServer,
    fleet_client: ToolClient,
    tmp_path: Path,
    pool: Pool,
    half: bool,
) -> None:
    proxy = Proxy(own_server.port)
    try:
        start_fleet(worker_factory, deploy_env(proxy.url, tmp_path / "data"), pool=pool)

        def drops() -> None:  # every connection of every worker, four times a second apart
            for _ in range(4):
                proxy.drop(half=half)
                time.sleep(1.0)  # the fault's own rhythm, not a wait for anything

        batch = run_batch(
            fleet_client,
            "deploy_alo",
            16,
            seconds=1.0,
            deadline=40.0,
            data=tmp_path / "data",
            fault=drops,
        )
    finally:
        proxy.close()

    batch.check()
    assert batch.kinds() == {"result": 16}
