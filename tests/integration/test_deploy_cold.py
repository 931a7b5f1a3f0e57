"""A deploy stops one worker of two in the middle of a batch, cold (``SIGQUIT``): nothing
runs twice, and ``WorkerLost`` is heard only of calls the stop cut off.

A cold stop ends the calls it runs at once: an at-most-once one of those may have run,
and its caller hears so; an at-least-once one runs again on the other worker; the calls
taken but not started go back to their queue, as for a warm stop
(``test_deploy_warm.py``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from agent_client import ToolClient
from tests.integration.conftest import WorkerFactory
from tests.integration.deploy_support import process_ids, run_batch, start_fleet
from tests.integration.polling import wait_until
from toolexec import Pool

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "asyncio", "solo"]


@pytest.mark.parametrize("tool", ["deploy_plain", "deploy_alo"])
@pytest.mark.parametrize("pool", POOLS)
def test_a_cold_stop_of_one_worker_runs_nothing_twice_and_tells_worker_lost_only_of_calls_it_cut_off(  # noqa: E501
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
        fault=lambda: os.kill(victim.pid or 0, signal.SIGQUIT),
        died=lambda: process_ids([victim]),
    )

    batch.check()
    # A documented stop is no crash: Celery's cancel of a running call on a pool that
    # cannot end one call (threads, asyncio) used to fail with NotImplementedError.
    assert wait_until(lambda: not victim.is_running, timeout=30), (
        "the worker did not leave after its cold stop"
    )
    log = victim.log_path.read_text(errors="replace")
    assert "CRITICAL" not in log and "NotImplementedError" not in log, log[-3000:]
    if tool == "deploy_alo":  # the calls it cut off run again on the other worker
        assert batch.kinds() == {"result": 16}
    else:  # those may have run: their callers hear so; every other call ran once
        cut_off = [t for t, o in batch.outcomes.items() if not isinstance(o, dict)]
        assert len(cut_off) <= 2 and all(batch.ran(t) == 0 for t in cut_off), batch.kinds()
        assert all(batch.ran(t) == 1 for t in batch.outcomes if t not in cut_off)
