"""A Redis out of memory (``maxmemory`` with ``noeviction``) runs nothing twice and tells
nobody ``WorkerLost``; one that evicts keys is refused.

* For four seconds Redis refuses every write. The workers' heartbeats keep their keys
  and their calls' records alive with ``PEXPIRE`` (which it still takes), and a
  client's watchdog, which must fence a call before it gives it up or sends it again,
  can do neither: a call taken while Redis is full waits for its record, and its
  outcome is delivered once Redis takes writes again.
* A worker that starts, or reconnects, while Redis is full waits for room instead of
  dying of the refusal.
* A Redis whose ``maxmemory-policy`` evicts keys would drop the claims and records
  nothing-runs-twice rests on: a worker refuses to start on one, and ``toolexec
  doctor`` says why.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from agent_client import ToolClient, remote_tool
from tests.integration.conftest import PROJECT_ROOT, WorkerFactory
from tests.integration.deploy_support import QUEUE, run_batch, start_fleet
from tests.integration.polling import wait_until
from toolexec import Pool, RedisServer, WorkerProcess
from toolexec.doctor import run_checks
from toolexec.errors import ProcessStartFailed
from wire.settings import Settings

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "asyncio"]


def _full_for(server: RedisServer, seconds: float) -> None:
    with redis.Redis.from_url(server.url) as store:
        used = int(store.info("memory")["used_memory"])
        store.config_set("maxmemory-policy", "noeviction")
        store.config_set("maxmemory", max(1, used // 2))  # every write refused
        try:
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                store.set("toolexec-test:full?", "1")
            time.sleep(seconds)
        finally:
            store.config_set("maxmemory", 0)


@pytest.mark.parametrize("tool", ["deploy_plain", "deploy_idem"])
@pytest.mark.parametrize("pool", POOLS)
def test_redis_out_of_memory_for_four_seconds_runs_nothing_twice_and_tells_nobody_worker_lost(
    worker_factory: WorkerFactory,
    own_server: RedisServer,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    tmp_path: Path,
    pool: Pool,
    tool: str,
) -> None:
    start_fleet(worker_factory, fleet_env, pool=pool)

    batch = run_batch(
        fleet_client,
        tool,
        16,
        seconds=1.0,
        deadline=30.0,
        data=tmp_path / "data",
        fault=lambda: _full_for(own_server, 4.0),
    )

    batch.check()
    assert batch.kinds() == {"result": 16}


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_started_while_redis_is_full_waits_for_room_and_then_serves(
    own_server: RedisServer,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    tmp_path: Path,
    pool: Pool,
) -> None:
    worker = WorkerProcess(
        name=f"full-{pool}",
        pool=pool,
        queues=(QUEUE,),
        env=fleet_env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path / "logs",
    )
    with redis.Redis.from_url(own_server.url) as store:
        store.set("toolexec-test:filler", "x" * 200_000)
        store.config_set("maxmemory", int(store.info("memory")["used_memory"]) // 2)
        try:
            worker.start(wait=False)  # it connects, and declares its queues, while Redis is full
            # It lives through four seconds of a full Redis (before, it died at its first
            # connection: "Unrecoverable error: OutOfMemoryError").
            assert wait_until(lambda: not worker.is_running, timeout=4.0) is False, (
                worker.log_tail()
            )
        finally:
            store.config_set("maxmemory", 0)
    try:
        assert worker.wait_ready(timeout=20).pid == worker.pid  # Redis has room: it beats
        assert (
            remote_tool("deploy_plain", client=fleet_client, timeout=10)(
                token="after", seconds=0.0
            )["pid"]
            > 0
        )
    finally:
        worker.stop()


def test_a_worker_refuses_to_start_on_a_redis_that_evicts_keys_and_the_doctor_says_why(
    own_server: RedisServer, fleet_env: dict[str, str], tmp_path: Path
) -> None:
    with redis.Redis.from_url(own_server.url) as store:
        store.config_set("maxmemory-policy", "allkeys-lru")
    worker = WorkerProcess(
        name="evicting", queues=(QUEUE,), env=fleet_env, cwd=PROJECT_ROOT, log_dir=tmp_path / "logs"
    )
    with pytest.raises(ProcessStartFailed, match="maxmemory-policy allkeys-lru"):
        worker.start(timeout=30)
    checks = {check.name: check for check in run_checks(Settings.from_env(fleet_env))}
    assert not checks["eviction"].ok
    assert "allkeys-lru" in checks["eviction"].message and "noeviction" in checks["eviction"].fix
