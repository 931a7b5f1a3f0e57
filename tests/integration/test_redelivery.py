"""An at-least-once call whose process dies every time is run at most TOOLEXEC_MAX_DELIVERIES times.

Before the limit, a tool that ended its process (``os._exit``, a segfault, the OOM
killer) was requeued by Celery forever: about 160 crashed pool processes in 30 s, and
its caller never heard ``WorkerLost``. Here the tool counts its runs in Redis and
``os._exit(1)``s: the caller, and every caller that joined the same idempotent call, get
``WorkerLost`` naming the attempts within seconds, the tool ran exactly the limit's number
of times, the call is dead-lettered, and the same worker serves the next call.

On prefork the worker's main process counts the deaths of its pool processes. On every
other pool the process that dies is the worker itself, as when a prefork worker's main
process is killed: then the caller's watchdog counts, on every pool, also for a call
with no deadline.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
import redis

from agent_client import ToolClient, WorkerLost, remote_tool, run_scope
from toolexec import Pool, WorkerProcess
from wire import keys
from wire.settings import Settings

from .conftest import WorkerFactory
from .fault_support import FAULT_QUEUE, fault_env, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def worker(worker_factory: WorkerFactory, settings_env: dict[str, str]) -> WorkerProcess:
    """A prefork worker (concurrency 2) of the fault tools, with the default limit of 3."""
    return worker_factory(
        pool="prefork", concurrency=2, queues=(FAULT_QUEUE,), env=fault_env(settings_env)
    )


def runs(client: redis.Redis, counter: str) -> int:
    return int(client.get(counter) or 0)


def given_up(client: redis.Redis) -> int:
    """How many calls workers gave up after their processes died (dead-letter count)."""
    return int(client.hget(keys.DEADLETTER_COUNT, "worker_lost") or 0)


def test_an_idempotent_tool_that_kills_its_process_runs_three_times_then_every_caller_gets_worker_lost(  # noqa: E501
    worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    counter = unique("faults:runs")
    crash = remote_tool("fault_crash", timeout=30)
    assert crash.idempotent and crash.spec.delivery == "at_least_once"
    pid = worker.pid
    before = given_up(redis_client)

    async def two_callers_of_one_call() -> tuple[list[BaseException | None], float]:
        started = time.monotonic()
        async with run_scope():
            outcomes = await asyncio.gather(
                crash.run(counter=counter), crash.run(counter=counter), return_exceptions=True
            )
        return list(outcomes), time.monotonic() - started

    outcomes, elapsed = asyncio.run(two_callers_of_one_call())

    assert all(isinstance(o, WorkerLost) for o in outcomes), outcomes
    for outcome in outcomes:
        assert "the worker process died 3 times running this call; it was given up" in str(outcome)
    assert elapsed < 10.0, f"WorkerLost came after {elapsed:.1f}s"
    assert runs(redis_client, counter) == 3
    # The worker is the same, serves on, and the crashing call never ran again.
    assert remote_tool("fault_echo", timeout=10)(text="next")["text"] == "next"
    assert worker.is_running and worker.pid == pid
    assert runs(redis_client, counter) == 3
    assert redis_client.llen(FAULT_QUEUE) == 0
    assert given_up(redis_client) == before + 1  # one message, dead-lettered once
    assert json.loads(redis_client.lindex(keys.DEADLETTER, 0) or b"{}")["reason"] == "worker_lost"


def test_a_plain_at_least_once_tool_that_kills_its_process_is_given_up_after_the_limit_too(
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    worker = worker_factory(
        pool="prefork",
        concurrency=1,
        queues=(FAULT_QUEUE,),
        env=fault_env(settings_env, TOOLEXEC_MAX_DELIVERIES="2"),
    )
    counter = unique("faults:runs")
    crash = remote_tool("fault_crash_plain", timeout=30)
    assert not crash.idempotent and crash.spec.delivery == "at_least_once"

    started = time.monotonic()
    with pytest.raises(WorkerLost, match="died 2 times running this call"):
        crash.invoke_sync({"counter": counter}, timeout=None)  # no deadline at all

    assert time.monotonic() - started < 10.0
    assert runs(redis_client, counter) == 2
    assert remote_tool("fault_echo", timeout=10)(text="next")["text"] == "next"
    assert runs(redis_client, counter) == 2
    assert worker.is_running


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads", "asyncio"])
def test_an_at_least_once_call_that_kills_its_whole_worker_each_time_is_sent_the_limits_number_of_times_then_given_up(  # noqa: E501
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    redis_client: redis.Redis,
    pool: Pool,
) -> None:
    # Not a pool process but the worker itself dies with the call (SIGKILL to a prefork
    # worker's main process; os._exit in the process of any other pool): no worker is
    # left to count the deaths, so the caller's watchdog does. It sends the call again
    # under the same key until it has been sent TOOLEXEC_MAX_DELIVERIES times, then
    # dead-letters it and says WorkerLost. The call has no deadline.
    env = fault_env(settings_env, TOOLEXEC_MAX_DELIVERIES="2")
    workers = [
        worker_factory(pool=pool, concurrency=1, queues=(FAULT_QUEUE,), env=env, wait=False)
        for _ in range(3)
    ]
    for worker in workers:
        worker.wait_ready()
    client = ToolClient(Settings.from_env(env))
    try:
        tool = "fault_kill_worker" if pool == "prefork" else "fault_crash"
        kill = remote_tool(tool, timeout=None, client=client)
        assert kill.spec.delivery == "at_least_once"
        counter = unique("faults:runs")
        before = given_up(redis_client)

        with (
            run_scope(),
            pytest.raises(
                WorkerLost, match=r"it was sent 2 times \(TOOLEXEC_MAX_DELIVERIES\)"
            ) as lost,
        ):
            kill(counter=counter)

        assert runs(redis_client, counter) == 2
        assert sum(not w.is_running for w in workers) == 2  # the third never took it
        assert given_up(redis_client) == before + 1
        entry = json.loads(redis_client.lindex(keys.DEADLETTER, 0) or b"{}")
        assert entry["reason"] == "worker_lost" and entry["queue"] == FAULT_QUEUE
        envelope = json.loads(base64.b64decode(entry["payload_b64"]))
        assert counter in base64.b64decode(envelope["body"]).decode()  # the call, as it was queued
        assert entry["call_id"] and "the worker running this call stopped beating" in str(
            lost.value
        )
        assert "died on each of 2 deliveries" in entry["detail"]
    finally:
        client.close()


def test_calls_sent_again_after_their_worker_died_wait_behind_a_busy_survivor_and_run_once(
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
) -> None:
    # Two workers share the calls; one is killed, whole, while it runs its share. The
    # watchdog sends those calls again; the survivor runs two at a time, so the copies
    # wait in the queue for longer than the watchdog's looks, with their keys' state
    # still naming the dead worker. Waiting is not being lost: each call runs to its end
    # once, and no caller hears WorkerLost.
    env = {
        **own_env,
        "TOOLEXEC_TOOL_MODULES": f"{own_env['TOOLEXEC_TOOL_MODULES']},tests.integration.idem_tools",
    }
    doomed = worker_factory(pool="prefork", concurrency=2, queues=("idem_kill",), env=env)
    survivor = worker_factory(pool="prefork", concurrency=2, queues=("idem_kill",), env=env)
    interval = Settings.from_env(own_env).heartbeat_interval
    slow = remote_tool("idem_slow_alo", timeout=60, client=own_client)
    tag = unique("busy")
    calls = 10

    def pid_of(i: int) -> int:
        return int(own_store.get(f"{tag}:pid:{i}") or 0)

    async def everything() -> list[object]:
        async def one(i: int) -> object:
            with run_scope():  # a run of its own: one execution per call
                return await slow.invoke(
                    {"counter": f"{tag}:{i}", "seconds": 2 * interval, "marker": f"{tag}:pid:{i}"}
                )

        tasks = [asyncio.ensure_future(one(i)) for i in range(calls)]
        children = set(doomed.child_pids())
        while not any(pid_of(i) in children for i in range(calls)):  # the doomed worker runs one
            await asyncio.sleep(0.02)
        doomed.kill()  # the main process and its children, SIGKILL
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(everything())

    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert survivor.is_running
    survivors = set(survivor.child_pids())
    results = [o for o in outcomes if isinstance(o, dict)]
    assert len(results) == calls
    assert all(r["pid"] in survivors for r in results), results  # the dead worker finished none
    # A call the dead worker had begun ran once more on the survivor; none ran a third time.
    assert {int(own_store.get(f"{tag}:{i}") or 0) for i in range(calls)} <= {1, 2}
    assert any(r["runs"] == 2 for r in results), results  # the kill did cut a call short
