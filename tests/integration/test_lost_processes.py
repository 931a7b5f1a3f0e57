"""Processes that die: a killed worker's calls run once more at most, and a call given up
never starts again.

* **A whole worker killed** (``SIGKILL``) while the other has a backlog: its
  at-least-once idempotent calls are sent again and wait behind that backlog (not
  ``WorkerLost``); each runs to its end once.
* **A crash-looping call** (its tool ends the process running it) is sent
  ``TOOLEXEC_MAX_DELIVERIES`` times, then given up (``WorkerLost``); its fence is ``x``
  from then on, so no copy of it starts again, on any worker started later.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
from pathlib import Path

import pytest
import redis

from agent_client import ToolClient, WorkerLost, remote_tool
from tests.integration.conftest import WorkerFactory
from tests.integration.deploy_support import QUEUE, deploy_env, process_ids, run_batch, start_fleet
from tests.integration.polling import wait_until
from toolexec import Pool, RedisServer
from wire import keys
from wire.copies import FENCED, sent_again

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "asyncio"]


@pytest.fixture
def fleet_env(own_server: RedisServer, tmp_path: Path) -> dict[str, str]:
    return deploy_env(own_server, tmp_path / "data", TOOLEXEC_MAX_DELIVERIES="2")


@pytest.mark.parametrize("pool", POOLS)
def test_a_killed_worker_s_idempotent_calls_wait_behind_the_other_s_backlog_and_each_runs_to_its_end_once(  # noqa: E501
    worker_factory: WorkerFactory,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    tmp_path: Path,
    pool: Pool,
) -> None:
    victim, _ = start_fleet(worker_factory, fleet_env, pool=pool)

    batch = run_batch(
        fleet_client,
        "deploy_idem",
        16,
        seconds=1.0,
        deadline=30.0,
        data=tmp_path / "data",
        fault=victim.kill,
        died=lambda: process_ids([victim]),
    )

    batch.check()
    assert batch.kinds() == {"result": 16}
    assert all(batch.ran(token) == 1 for token in batch.outcomes)


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_a_crash_looping_call_given_up_never_starts_again_on_a_worker_started_later(
    worker_factory: WorkerFactory,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    own_server: RedisServer,
    tmp_path: Path,
    pool: Pool,
) -> None:
    workers = [worker_factory(pool=pool, queues=(QUEUE,), env=fleet_env)]
    crash = remote_tool("deploy_crash", client=fleet_client, timeout=None)
    with concurrent.futures.ThreadPoolExecutor(1) as caller:
        call = caller.submit(crash, token="loop")
        # An orchestrator: each worker the call kills is replaced, until the call ends.
        while not call.done():
            wait_until(lambda: call.done() or not workers[-1].is_running, timeout=30)
            if not call.done() and not workers[-1].is_running:
                workers.append(worker_factory(pool=pool, queues=(QUEUE,), env=fleet_env))
        with pytest.raises(WorkerLost, match="sent 2 times"):
            call.result()
    assert _starts(tmp_path, "loop") == 2  # TOOLEXEC_MAX_DELIVERIES
    for worker in workers:  # the fresh worker below is the only one
        worker.stop(timeout=5)

    with redis.Redis.from_url(own_server.url) as store:
        (fence,) = store.keys(keys.fence("*"))
        assert store.get(fence) == FENCED.encode()
        (entry,) = [json.loads(e) for e in store.lrange(keys.DEADLETTER, 0, -1)]
        # A copy the watchdog had sent, left over in the queue (as a worker that died
        # holding it might leave it), then a plain call behind it, for a fresh worker
        # that runs one call at a time: it takes the copy first and must not run it.
        store.lpush(QUEUE, sent_again(base64.b64decode(entry["payload_b64"]), 1))
    fresh = worker_factory(pool=pool, concurrency=1, queues=(QUEUE,), env=fleet_env)
    assert (
        remote_tool("deploy_plain", client=fleet_client, timeout=20)(token="after", seconds=0.0)[
            "pid"
        ]
        == fresh.pid
    )
    assert fresh.is_running
    assert _starts(tmp_path, "loop") == 2


def _starts(tmp_path: Path, token: str) -> int:
    return (tmp_path / "data" / "runs" / token).read_text().split().count("start")
