"""What every Celery pool must guarantee: abandoned queued calls never run, hard limits hold.

Each test runs once per pool against one concurrency-1 worker on the ``single`` queue.
The worker is module-scoped per pool: pytest groups the tests by pool and stops one
pool's worker before it starts the next, so only one worker consumes ``single``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_client import ToolClient, ToolExecutionError, ToolTimeoutError, remote_tool
from executor.launch import Pool, WorkerProcess

from .polling import wait_until, wait_until_async

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]
QUEUE = "single"


@pytest.fixture(scope="module", params=["prefork", "solo", "threads"])
def single_worker(
    request: pytest.FixtureRequest,
    probe_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """One worker of the given pool with concurrency 1, the only consumer of ``single``."""
    pool: Pool = request.param
    worker = WorkerProcess(
        name=f"single-{pool}-{uuid.uuid4().hex[:8]}",
        pool=pool,
        concurrency=1,
        queues=(QUEUE,),
        env=probe_env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp(f"single-{pool}"),
    )
    with worker:
        yield worker


def test_calls_whose_callers_gave_up_while_queued_never_run(
    single_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    run = uuid.uuid4().hex
    started, counted, control = (f"probe:{what}:{run}" for what in ("started", "count", "control"))
    block = remote_tool("probe_block_single", timeout=10)
    count = remote_tool("probe_count_single", timeout=0.3)

    async def queue_behind_a_busy_worker() -> tuple[list[Any], Any]:
        blocker = asyncio.ensure_future(block.run(seconds=1.5, marker=started))
        assert await wait_until_async(lambda: blocker.done() or redis_client.exists(started))
        assert not blocker.done(), "the blocking call ended before the others were queued"
        gave_up = await asyncio.gather(
            *(count.run(key=counted) for _ in range(5)), return_exceptions=True
        )
        return gave_up, await blocker

    gave_up, blocked = asyncio.run(queue_behind_a_busy_worker())

    assert all(isinstance(outcome, ToolTimeoutError) for outcome in gave_up), gave_up
    assert blocked["slept"] == 1.5
    # The worker is free again: it drains the queue, then runs a call with time to spare.
    assert wait_until(lambda: redis_client.llen(QUEUE) == 0)
    assert remote_tool("probe_count_single", timeout=10)(key=control) == 1
    assert redis_client.get(counted) is None, "a call whose caller had given up ran"


@pytest.mark.parametrize("tool_name", ["probe_hard_single", "probe_async_hard_single"])
def test_a_tool_past_its_hard_limit_is_stopped_and_reported_within_two_seconds(
    single_worker: WorkerProcess, tool_client: ToolClient, tool_name: str
) -> None:
    hard = remote_tool(tool_name, timeout=10)
    assert hard.spec.hard_timeout == 0.5

    started = time.monotonic()
    with pytest.raises(ToolExecutionError) as raised:
        hard(seconds=5)
    elapsed = time.monotonic() - started

    assert elapsed < 2.0, f"took {elapsed:.2f}s"
    assert raised.value.remote_type == "ToolHardTimeout"
    assert "hard limit" in raised.value.remote_message
    # The worker is not stuck behind the abandoned run.
    echoed = remote_tool("probe_echo_single", timeout=5)(text="after the limit", number=2)
    assert echoed["text"] == "after the limit"


def test_the_heartbeat_names_the_pool_as_the_worker_was_started_with(single_worker: WorkerProcess) -> None:
    assert single_worker.info is not None
    assert single_worker.info.pool == single_worker.pool
