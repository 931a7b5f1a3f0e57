"""What every worker pool guarantees: prefork, solo, threads and toolexec's asyncio pool.

Each test runs once per pool against one concurrency-1 worker on the ``single`` queue.
The worker is module-scoped per pool: pytest groups the tests by pool and stops one
pool's worker before it starts the next, so only one worker consumes ``single``. The
guarantees that cost a worker its life (a killed worker, a warm stop, a skewed clock)
are parametrized over the same pools in their own modules; ``docs/guarantees.md``
lists them all ("Every pool").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_client import ToolClient, ToolExecutionError, ToolTimeoutError, remote_tool, run_scope
from toolexec import Pool, WorkerProcess
from wire import keys
from wire.formats import parse_holder_tag
from wire.models import CallRequest

from .polling import wait_until, wait_until_async
from .raw_calls import push_call, read_replies

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]
QUEUE = "single"
#: Every pool, by its name for WorkerProcess (and the ids of the parametrized tests).
POOLS: list[Pool] = ["prefork", "solo", "threads", "asyncio"]


@pytest.fixture(scope="module", params=POOLS)
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
        # The probes, and the idempotent and sys.exit tools on this queue too.
        env={
            **probe_env,
            "TOOLEXEC_TOOL_MODULES": probe_env["TOOLEXEC_TOOL_MODULES"]
            + ",tests.integration.pool_tools",
        },
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


def test_the_heartbeat_names_the_pool_as_the_worker_was_started_with(
    single_worker: WorkerProcess,
) -> None:
    assert single_worker.info is not None
    assert single_worker.info.pool == single_worker.pool


#: How much more TTL than time alone leaves shows a holder record was written again:
#: a rewrite puts back about a third of the 1 s interval, far above clock noise.
_REWRITE_SEEN_MS = 100


def test_a_running_call_is_recorded_as_held_by_the_worker_and_the_process_running_it(
    single_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    assert single_worker.info is not None
    marker = f"probe:pid:{uuid.uuid4().hex}"
    block = remote_tool("probe_block_single", timeout=20)
    # Records of this client's earlier calls (they outlive their calls for a while).
    mine = keys.running(f"{tool_client.client_id}-*")
    earlier = set(redis_client.scan_iter(match=mine))

    def record() -> bytes | None:
        new = [key for key in redis_client.scan_iter(match=mine) if key not in earlier]
        assert len(new) <= 1, new
        return new[0] if new else None

    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        # Long enough that the record's rewrite is looked for while the call surely runs,
        # however late a loaded machine lets the test get there.
        call = threads.submit(block, seconds=8.0, marker=marker)
        assert wait_until(lambda: redis_client.exists(marker)), "the call never started"
        running = int(redis_client.get(marker) or 0)
        # The heartbeat records it within a third of an interval, naming the process...
        assert wait_until(
            lambda: record() is not None and redis_client.get(record() or "") is not None
        )
        key = record()
        assert key is not None
        holder = parse_holder_tag(redis_client.get(key) or b"")
        assert wait_until(
            lambda: parse_holder_tag(redis_client.get(key) or b"") == (holder[0], running)
        )
        # ...and keeps it: it is written again while the call runs. Left alone, its TTL
        # falls by the time that passes; each rewrite (every third of the 1 s interval)
        # puts back what the beats between took. (Comparing with the first reading
        # alone misses a rewrite that comes right after it.)
        left, read_at = redis_client.pttl(key), time.monotonic()

        def rewritten() -> bool:
            passed_ms = (time.monotonic() - read_at) * 1000
            return redis_client.pttl(key) > left - passed_ms + _REWRITE_SEEN_MS

        assert not call.done()
        assert wait_until(lambda: rewritten() or call.done(), timeout=8.0)
        assert rewritten(), "the record was not written again while its call ran"
        assert call.result(timeout=20)["slept"] == 8.0

    assert holder[0] == single_worker.info.worker_id
    # On prefork a pool process runs it; on the other pools the worker's own process.
    if single_worker.pool == "prefork":
        assert running in single_worker.child_pids()
    else:
        assert running == single_worker.pid


def test_a_message_delivered_three_times_runs_once_and_answers_every_delivery(
    single_worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    counter = f"idemtest:count:{uuid.uuid4().hex}"
    call = CallRequest(
        call_id=uuid.uuid4().hex,
        tool="idem_count_single",
        arguments={"counter": counter, "seconds": 1.0},
        reply_to=f"idemtest-{uuid.uuid4().hex}",
        deadline=time.time() + 30,
        idempotency_key=uuid.uuid4().hex,
    )
    # Three deliveries at once: one runs, the others join it (or, one at a time on this
    # concurrency-1 worker, find its stored outcome); one after it finished: the store.
    push_call(redis_client, call, queue=QUEUE, times=3)
    during = read_replies(redis_client, call.reply_to, 3)
    push_call(redis_client, call, queue=QUEUE)
    after = read_replies(redis_client, call.reply_to, 1)

    assert int(redis_client.get(counter) or 0) == 1
    assert len(during) == 3 and len(after) == 1
    assert all(o.ok and o.result == during[0].result for o in during + after)


def test_a_retry_after_a_timeout_joins_the_execution_still_running(
    single_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    count = remote_tool("idem_count_single")
    counter = f"idemtest:count:{uuid.uuid4().hex}"
    arguments = {"counter": counter, "seconds": 1.5}
    with run_scope():
        with pytest.raises(ToolTimeoutError):
            count.invoke_sync(arguments, timeout=0.3)
        started = time.monotonic()
        retried = count.invoke_sync(arguments, timeout=10)
        joined_after = time.monotonic() - started
        again = count.invoke_sync(arguments, timeout=10)  # answered from the store
    assert int(redis_client.get(counter) or 0) == 1
    assert retried == again and retried["runs"] == 1
    assert joined_after < 1.5, "the retry waited for a second execution"


def test_a_tool_that_calls_sys_exit_gets_an_execution_error_naming_system_exit_and_its_process_stays(  # noqa: E501
    single_worker: WorkerProcess, tool_client: ToolClient
) -> None:
    echo = remote_tool("probe_echo_single", timeout=10)
    before = echo(text="before", number=1)["pid"]

    # At most once (acknowledged first) and at least once (idempotent: acknowledged after).
    for tool in ("fault_exit_single", "fault_exit_idempotent_single"):
        with pytest.raises(ToolExecutionError) as raised:
            remote_tool(tool, timeout=10)(code=3)
        assert raised.value.remote_type == "SystemExit"
        assert "called sys.exit(3)" in raised.value.remote_message

    assert echo(text="after", number=2)["pid"] == before
    assert single_worker.is_running
