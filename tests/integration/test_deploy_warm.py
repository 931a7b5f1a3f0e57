"""A deploy stops one worker of two in the middle of a batch, warm (``SIGTERM``): every
call runs once, nobody hears ``WorkerLost``.

A warm stop lets the calls it runs finish and puts back, at the front of their queue,
the calls it had taken but not started (their holder records go with them, so no
waiting client takes them for lost): their callers wait and get their results from the
other worker, each call run once. ``test_deploy_cold.py`` stops one cold.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agent_client import ToolClient
from tests.integration.conftest import WorkerFactory
from tests.integration.deploy_support import run_batch, start_fleet
from toolexec import Pool

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "asyncio"]


@pytest.mark.parametrize("tool", ["deploy_plain", "deploy_idem"])
@pytest.mark.parametrize("pool", POOLS)
def test_a_warm_stop_of_one_worker_runs_every_call_once_and_tells_nobody_worker_lost(
    worker_factory: WorkerFactory,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    tmp_path: Path,
    pool: Pool,
    tool: str,
) -> None:
    victim, _ = start_fleet(worker_factory, fleet_env, pool=pool)

    batch = run_batch(
        fleet_client,
        tool,
        16,
        seconds=1.0,
        deadline=30.0,
        data=tmp_path / "data",
        fault=lambda: os.kill(victim.pid or 0, signal.SIGTERM),
    )

    batch.check()
    assert batch.kinds() == {"result": 16}
    assert all(batch.ran(token) == 1 for token in batch.outcomes)
