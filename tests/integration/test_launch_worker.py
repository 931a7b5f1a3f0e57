"""Real ``celery -A executor worker`` processes, started and stopped by the launcher.

A warm stop (``SIGTERM``) lets the calls running on any pool finish and answer their
callers before the worker leaves.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from agent_client import ToolClient, remote_tool
from toolexec import Pool
from wire import keys

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def _wait_until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def test_a_prefork_worker_is_ready_with_its_heartbeat_and_pool_children(
    worker_factory: WorkerFactory,
) -> None:
    worker = worker_factory(pool="prefork", concurrency=2, queues=("default", "slow"))
    assert worker.info is not None
    assert worker.info.pid == worker.pid
    assert worker.info.hostname.startswith(f"{worker.name}@")
    assert set(worker.info.queues) == {"default", "slow"}
    assert worker.info.pool == "prefork"
    assert _wait_until(lambda: len(worker.child_pids()) == 2)


@pytest.mark.parametrize("pool", ["solo", "threads", "asyncio"])
def test_workers_of_the_other_pools_become_ready(worker_factory: WorkerFactory, pool: Pool) -> None:
    worker = worker_factory(pool=pool, concurrency=2)
    assert worker.info is not None
    assert worker.info.pid == worker.pid


def test_a_killed_pool_child_is_replaced_and_the_worker_lives_on(
    worker_factory: WorkerFactory,
) -> None:
    worker = worker_factory(pool="prefork", concurrency=2)
    assert _wait_until(lambda: len(worker.child_pids()) == 2)
    victim = worker.child_pids()[0]
    os.kill(victim, signal.SIGKILL)
    assert _wait_until(lambda: victim not in worker.child_pids() and len(worker.child_pids()) == 2)
    assert worker.is_running


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads", "asyncio"])
def test_a_warm_stop_lets_running_calls_finish_and_answer_then_removes_the_heartbeat_and_every_process(  # noqa: E501
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
    tool_client: ToolClient,
    redis_client: redis.Redis,
    pool: Pool,
) -> None:
    concurrency = 1 if pool == "solo" else 2
    worker = worker_factory(pool=pool, concurrency=concurrency, env=probe_env)
    assert worker.info is not None
    key = keys.worker(worker.info.worker_id)
    if pool == "prefork":
        assert _wait_until(lambda: len(worker.child_pids()) == concurrency)
    pids = [worker.info.pid, *worker.child_pids()]
    sleeper = remote_tool("probe_sleep", timeout=30)
    markers = [f"probetest:pid:{uuid.uuid4().hex}" for _ in range(concurrency)]

    with concurrent.futures.ThreadPoolExecutor(concurrency) as threads:
        calls = [threads.submit(sleeper, seconds=2.0, marker=marker) for marker in markers]
        assert _wait_until(lambda: redis_client.exists(*markers) == concurrency), (
            "the calls never started"
        )
        begun = time.monotonic()
        worker.stop(timeout=15.0)  # SIGTERM; SIGKILL only after 15 s
        stopped = time.monotonic() - begun
        results = [call.result(timeout=20) for call in calls]

    # Every running call finished and its caller got the result, before the worker left.
    assert [r["slept"] for r in results] == [2.0] * concurrency
    assert stopped < 10.0, f"the worker took {stopped:.1f}s to stop: it was killed"
    assert not worker.is_running
    assert not any(_alive(pid) for pid in pids)
    assert redis_client.exists(key) == 0


def test_kill_loses_the_whole_worker_and_its_heartbeat_expires(
    worker_factory: WorkerFactory, redis_client: redis.Redis
) -> None:
    worker = worker_factory(pool="prefork", concurrency=2)
    assert worker.info is not None
    key = keys.worker(worker.info.worker_id)
    assert _wait_until(lambda: len(worker.child_pids()) == 2)
    pids = [worker.info.pid, *worker.child_pids()]
    worker.kill()
    assert not worker.is_running
    assert _wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=5.0)
    # TOOLEXEC_HEARTBEAT_INTERVAL is 1 s in the tests: the key's TTL.
    assert _wait_until(lambda: redis_client.exists(key) == 0, timeout=3.0)


@pytest.mark.parametrize("stop", ["warm", "cold", "kill"])
def test_only_a_worker_that_stopped_warm_says_it_left_and_clients_count_the_others_gone(
    worker_factory: WorkerFactory, tool_client: ToolClient, redis_client: redis.Redis, stop: str
) -> None:
    # A warm stop finished or put back every call the worker held: a call found gone is
    # no call it took with it. A cold stop cut its calls off, and a kill took them.
    queue = f"leavers-{uuid.uuid4().hex[:8]}"
    worker = worker_factory(pool="solo", concurrency=1, queues=(queue,))
    assert worker.info is not None and worker.pid is not None
    worker_id = worker.info.worker_id
    catalog = tool_client.catalog
    since = time.monotonic()

    def gone() -> bool | None:
        return tool_client.io.run(lambda: catalog.worker_gone(queue, since), timeout=10)

    assert gone() is False  # seen beating

    if stop == "warm":
        worker.stop(timeout=15.0)
    elif stop == "cold":
        os.kill(worker.pid, signal.SIGQUIT)
        assert _wait_until(lambda: not worker.is_running, timeout=15.0)
    else:
        worker.kill()
    assert _wait_until(lambda: redis_client.exists(keys.worker(worker_id)) == 0, timeout=5.0)

    if stop == "warm":
        assert 0 < redis_client.pttl(keys.left(worker_id)) <= keys.LEFT_BEATS * 1000
        assert [gone(), gone()] == [False, False]
    else:
        assert redis_client.exists(keys.left(worker_id)) == 0
        # Gone, once Redis has taken this client's writes for an interval (None till then).
        assert _wait_until(lambda: gone() is True, timeout=10.0)
