"""Real ``celery -A executor worker`` processes, started and stopped by the launcher."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from executor import keys
from executor.launch import Pool

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


@pytest.mark.parametrize("pool", ["solo", "threads"])
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


def test_a_warm_stop_removes_the_heartbeat_and_every_process(
    worker_factory: WorkerFactory, redis_client: redis.Redis
) -> None:
    worker = worker_factory(pool="prefork", concurrency=2)
    assert worker.info is not None
    key = keys.worker(worker.info.worker_id)
    assert _wait_until(lambda: len(worker.child_pids()) == 2)
    pids = [worker.info.pid, *worker.child_pids()]
    worker.stop()
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
