"""The calls one read of the queue took are named as held until each is handed to Celery.

One read (``BLMPOP``, :mod:`executor.seams.transport`) takes as many messages as
prefetch leaves room for, and hands them to Celery one after another. On the solo pool
each call runs as it is handed over, in the consumer's own thread, so the calls after it
wait in the worker's memory for as long as the ones before them run. Named by no request
yet, they were neither queued nor held to the client's watchdog, which took them for
lost after two looks: it sent an at-least-once call again (it ran twice) and told an
at-most-once one's caller ``WorkerLost`` (it ran to its end). The heartbeat names them
(pid 0: taken, not started), as it names the calls waiting for a free process.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent_client import ToolClient
from tests.integration.conftest import WorkerFactory
from tests.integration.deploy_support import run_batch, start_fleet

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("tool", ["deploy_plain", "deploy_alo"])
def test_calls_a_solo_worker_read_at_once_wait_their_turn_and_none_is_taken_for_lost(
    worker_factory: WorkerFactory,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    tmp_path: Path,
    tool: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Room for 8 in prefetch, so one read takes all 8: the last waits 7 s behind the
    # others, past the watchdog's two looks (heartbeat interval 1 s).
    caplog.set_level(logging.WARNING, logger="agent_client._io.watchdog")
    start_fleet(worker_factory, fleet_env, pool="solo", count=1, concurrency=8)

    batch = run_batch(fleet_client, tool, 8, seconds=1.0, deadline=30.0, data=tmp_path / "data")

    batch.check()
    lost = [r.getMessage() for r in caplog.records if r.name == "agent_client._io.watchdog"]
    assert not lost, lost
    assert batch.kinds() == {"result": 8}
    assert all(batch.ran(token) == 1 for token in batch.outcomes)
