"""The asyncio pool's own promises, against real ``celery worker -P custom`` processes.

Each test starts its own asyncio-pool workers on the ``aio`` queue, whose probes live in
``probe_tools.py``. The guarantees every pool shares (shed calls, hard limits, the pool
named in the heartbeat) run on this pool too, in ``test_pools.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis
from celery import Celery

from agent_client import ToolClient, ToolExecutionError, WorkerLost, remote_tool, run_scope
from bench import names, raw_celery
from executor.pools.asyncio_pool import tool_threads
from toolexec import ChildProcess, Pool, WorkerProcess, celery_worker_argv
from toolexec.worker_process import pool_env
from wire import keys
from wire.formats import parse_holder_tag
from wire.message import redis_envelope, task_headers
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallOutcome, CallRequest, WorkerInfo
from wire.settings import Settings

from .conftest import PROJECT_ROOT
from .polling import wait_until, wait_until_async

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

QUEUE = "aio"
#: Keys the probes write for these tests; they expire on their own.
_PREFIX = "aiotest:"


@pytest.fixture
def start_worker(
    worker_factory: WorkerFactory, probe_env: dict[str, str], redis_client: redis.Redis
) -> Callable[..., WorkerProcess]:
    """Start a worker (asyncio pool unless told) on ``aio``, emptied first; stopped at teardown."""
    redis_client.delete(QUEUE)

    def start(
        concurrency: int = 100, pool: Pool = "asyncio", env: dict[str, str] | None = None
    ) -> WorkerProcess:
        return worker_factory(
            pool=pool, concurrency=concurrency, queues=(QUEUE,), env={**probe_env, **(env or {})}
        )

    return start


def _key(what: str) -> str:
    return f"{_PREFIX}{what}:{uuid.uuid4().hex}"


def _threads(pid: int) -> int:
    """The OS threads of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/task"))


def _pid_of(worker: WorkerProcess) -> int:
    assert worker.pid is not None
    return worker.pid


async def _gather_counting_threads(calls: list[Any], pid: int) -> tuple[list[Any], int]:
    """Await ``calls`` (awaitables), sampling the threads of ``pid``; (results, peak)."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    peak, pending = _threads(pid), set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=0.02)
        peak = max(peak, _threads(pid))
    return [task.result() for task in tasks], peak


def test_a_thousand_awaiting_calls_share_one_process_and_finish_together_on_at_most_eight_threads(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient
) -> None:
    worker = start_worker(concurrency=1000)
    pid = _pid_of(worker)
    wait = remote_tool("probe_async_wait", timeout=60)
    wait(seconds=0.0)  # warm: the client's listener and the worker's loop are up

    started = time.monotonic()
    results, peak = asyncio.run(
        _gather_counting_threads([wait.run(seconds=1.0) for _ in range(1000)], pid)
    )
    elapsed = time.monotonic() - started

    assert all(r["pid"] == pid and r["thread"] == "toolexec-asyncio" for r in results)
    assert peak <= 8, f"the worker ran {peak} threads"
    # More than Celery's threads pool with -c 100 could: it never has more than 100 calls
    # waiting at once, and needs 10 s. (The benchmark measures the time: scenario 8.)
    together = _most_at_once([(r["began"], r["ended"]) for r in results])
    assert together > 100, f"at most {together} calls awaited at once"
    assert elapsed < 10.0, f"1,000 calls awaiting 1 s took {elapsed:.2f}s"


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of ``(start, end)`` spans that overlap at one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_sync_tools_run_in_the_bounded_thread_pool(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient
) -> None:
    worker = start_worker(concurrency=100)
    pid = _pid_of(worker)
    blocking = remote_tool("probe_thread", timeout=60)
    calls = 3 * tool_threads(100)

    started = time.monotonic()
    results, peak = asyncio.run(
        _gather_counting_threads([blocking.run(seconds=0.5) for _ in range(calls)], pid)
    )
    elapsed = time.monotonic() - started

    names = {r["thread"] for r in results}
    assert all(r["pid"] == pid for r in results)
    assert all(name.startswith("toolexec-tool") for name in names), names
    assert 1 < len(names) <= tool_threads(100) == 32
    assert peak <= 32 + 8, f"the worker ran {peak} threads"
    # They ran side by side, three rounds of 32 (one at a time would take 48 s).
    assert elapsed < 10.0, f"{calls} calls blocking 0.5 s took {elapsed:.2f}s"


def test_the_hard_limit_cancels_an_async_tool_and_the_caller_is_told_at_once(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    start_worker(concurrency=10)
    hard = remote_tool("probe_async_hard", timeout=10)
    marker = _key("cancelled")

    started = time.monotonic()
    with pytest.raises(ToolExecutionError) as raised:
        hard(seconds=5.0, marker=marker)
    elapsed = time.monotonic() - started

    assert raised.value.remote_type == "ToolHardTimeout"
    assert "was stopped" in raised.value.remote_message
    assert elapsed < 2.0, f"took {elapsed:.2f}s"
    assert wait_until(lambda: redis_client.get(marker) == b"cancelled", timeout=5.0)


def test_the_heartbeat_names_the_worker_process_as_holder_of_a_running_call(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    worker = start_worker(concurrency=10)
    assert worker.info is not None
    worker_id = worker.info.worker_id
    wait = remote_tool("probe_async_wait", timeout=30)

    def held_by(worker_id: str) -> list[int]:
        """The pids of the holder records naming ``worker_id`` (other tests' records linger)."""
        tags = [redis_client.get(key) for key in redis_client.scan_iter(match=keys.running("*"))]
        return [
            pid for wid, pid in (parse_holder_tag(tag) for tag in tags if tag) if wid == worker_id
        ]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(wait, seconds=3.0)
        assert wait_until(lambda: held_by(worker_id), timeout=5.0), "no holder record appeared"
        assert held_by(worker_id) == [_pid_of(worker)]
        assert pending.result(timeout=30)["pid"] == _pid_of(worker)


def test_a_killed_asyncio_worker_is_reported_as_worker_lost_within_seconds(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    worker = start_worker(concurrency=10)
    wait = remote_tool("probe_async_wait", timeout=30)
    marker = _key("pid")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(wait, seconds=20.0, marker=marker)
        assert wait_until(lambda: redis_client.get(marker) is not None), "the call never started"
        assert int(redis_client.get(marker) or 0) == _pid_of(worker)
        worker.kill()
        killed = time.monotonic()
        with pytest.raises(WorkerLost):
            pending.result(timeout=30)
        elapsed = time.monotonic() - killed
    assert elapsed < 4.0, f"WorkerLost came {elapsed:.1f}s after the kill"


def test_a_warm_shutdown_lets_running_coroutines_finish_and_answer_their_callers(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    worker = start_worker(concurrency=100)
    wait = remote_tool("probe_async_wait", timeout=30)
    markers = [_key("pid") for _ in range(20)]

    async def stop_while_they_run() -> tuple[list[Any], float]:
        calls = [asyncio.ensure_future(wait.run(seconds=2.0, marker=m)) for m in markers]
        assert await wait_until_async(lambda: redis_client.exists(*markers) == len(markers))
        begun = time.monotonic()
        await asyncio.to_thread(worker.stop, 15.0)  # SIGTERM; SIGKILL only after 15 s
        stopped = time.monotonic() - begun
        return list(await asyncio.gather(*calls)), stopped

    results, stopped = asyncio.run(stop_while_they_run())

    assert [r["slept"] for r in results] == [2.0] * len(markers)
    assert stopped < 10.0, f"the worker took {stopped:.1f}s to stop: it was killed"
    assert not worker.is_running


def _push(client: redis.Redis, call: CallRequest, *, times: int) -> None:
    headers = task_headers(call, task_name=TASK_AT_LEAST_ONCE)
    envelope = redis_envelope(call, queue=QUEUE, headers=headers)
    for _ in range(times):
        client.lpush(QUEUE, envelope)


def _replies(
    client: redis.Redis, reply_to: str, n: int, timeout: float = 15.0
) -> list[CallOutcome]:
    out: list[CallOutcome] = []
    ends = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < ends:
        item = client.blpop([keys.reply(reply_to)], timeout=1)
        if item is not None:
            frame = cast(bytes, item[1])
            out.append(CallOutcome.model_validate_json(frame.partition(b"\n")[2]))
    return out


# The threads pool also runs several deliveries in one process, under one holder tag.
@pytest.mark.parametrize("pool", ["asyncio", "threads"])
def test_an_idempotent_call_delivered_three_times_at_once_to_one_process_runs_once(
    start_worker: Callable[..., WorkerProcess], redis_client: redis.Redis, pool: Pool
) -> None:
    start_worker(concurrency=10, pool=pool)
    counter = _key("count")
    call = CallRequest(
        call_id=uuid.uuid4().hex,
        tool="probe_async_idem",
        arguments={"counter": counter, "seconds": 1.0},
        reply_to=f"aiotest-{uuid.uuid4().hex}",
        deadline=time.time() + 30,
        idempotency_key=uuid.uuid4().hex,
    )
    _push(redis_client, call, times=3)  # three deliveries at once: one runs, two join it
    during = _replies(redis_client, call.reply_to, 3)
    _push(redis_client, call, times=1)  # and one after it finished: answered from the store
    after = _replies(redis_client, call.reply_to, 1)

    assert len(during) == 3 and len(after) == 1
    assert all(
        o.ok and o.result == {"runs": 1, "pid": during[0].result["pid"]} for o in during + after
    )
    assert int(redis_client.get(counter) or 0) == 1


def test_a_killed_asyncio_worker_hands_an_at_least_once_call_to_another_which_answers_it(
    start_worker: Callable[..., WorkerProcess], tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    workers = [start_worker(concurrency=10) for _ in range(2)]
    idem = remote_tool("probe_async_idem", timeout=30)
    assert idem.spec.delivery == "at_least_once"
    counter, marker = _key("count"), _key("pid")
    with concurrent.futures.ThreadPoolExecutor(1) as pool, run_scope() as run_id:
        started = time.monotonic()
        pending = pool.submit(
            idem.invoke_sync, {"counter": counter, "seconds": 3.0, "marker": marker}, run_id=run_id
        )
        assert wait_until(lambda: redis_client.get(marker) is not None), "the call never started"
        victim_pid = int(redis_client.get(marker) or 0)
        (victim,) = [w for w in workers if w.pid == victim_pid]
        (survivor,) = [w for w in workers if w is not victim]
        victim.kill()
        result = pending.result(timeout=30)
        elapsed = time.monotonic() - started
    assert result == {"runs": 2, "pid": survivor.pid}  # the killed run, then the re-run
    assert int(redis_client.get(counter) or 0) == 2
    assert elapsed < 15.0, f"the call took {elapsed:.1f}s"


def test_a_plain_celery_task_runs_celerys_own_trace_and_takes_one_of_the_slots(
    settings_env: dict[str, str], settings: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # The benchmark's plain Celery app: tasks without an async body, on one slot (-c 1).
    argv = celery_worker_argv(
        "bench.raw_celery",
        name=f"plain-{uuid.uuid4().hex[:8]}",
        pool="asyncio",
        concurrency=1,
        queues=[names.RAW_QUEUE],
    )
    env = {**os.environ, **settings_env, **pool_env("asyncio")}
    app = raw_celery.create_app(settings)
    redis_client.delete(names.RAW_QUEUE, names.SHED_RAN_RAW, names.SHED_BUSY)
    with ChildProcess("plain-celery", argv, env=env, cwd=PROJECT_ROOT, log_dir=tmp_path) as worker:
        app.send_task(raw_celery.SHED_MARK, queue=names.RAW_QUEUE, ignore_result=True)
        assert wait_until(lambda: redis_client.get(names.SHED_RAN_RAW) == b"1", timeout=30), (
            worker.log_tail()
        )
        # A busy task holds the only slot: the next one runs after it, not beside it.
        app.send_task(raw_celery.SHED_BUSY, args=(1000,), queue=names.RAW_QUEUE, ignore_result=True)
        app.send_task(raw_celery.SHED_MARK, queue=names.RAW_QUEUE, ignore_result=True)
        assert wait_until(lambda: redis_client.get(names.SHED_RAN_RAW) == b"2", timeout=30)
        assert not redis_client.exists(names.SHED_BUSY), "the second task ran beside the busy one"


def _heartbeat_of(client: redis.Redis, pid: int) -> WorkerInfo | None:
    """The live heartbeat of the worker whose main process is ``pid``, if any."""
    for key in client.scan_iter(match=keys.worker("*"), count=500):
        raw = client.get(key)
        if raw is not None:
            info = WorkerInfo.model_validate_json(raw)
            if info.pid == pid:
                return info
    return None


def _beating(process: ChildProcess, client: redis.Redis) -> WorkerInfo:
    """Wait for the heartbeat of ``process``'s worker and return it."""
    found: list[WorkerInfo] = []

    def beats() -> bool:
        info = _heartbeat_of(client, process.pid) if process.pid is not None else None
        if info is not None:
            found.append(info)
        return bool(found) or not process.is_running

    assert wait_until(beats, timeout=60), process.log_tail()
    assert found, f"the worker exited:\n{process.log_tail()}"
    return found[0]


def test_celery_worker_without_a_pool_option_runs_the_asyncio_pool_the_worker_pool_setting_names(
    probe_env: dict[str, str], redis_client: redis.Redis, tool_client: ToolClient, tmp_path: Path
) -> None:
    # Celery's own mechanism: `worker_pool` in the app's config, set from TOOLEXEC_WORKER_POOL.
    redis_client.delete(QUEUE)
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "executor",
        "worker",
        "-c",
        "50",
        "-Q",
        QUEUE,
        "-n",
        f"configured-{uuid.uuid4().hex[:8]}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "WARNING",
    ]
    env = {**os.environ, **probe_env, "TOOLEXEC_WORKER_POOL": "asyncio"}
    env.pop("CELERY_CUSTOM_WORKER_POOL", None)
    with ChildProcess("configured", argv, env=env, cwd=PROJECT_ROOT, log_dir=tmp_path) as worker:
        info, pid = _beating(worker, redis_client), worker.pid
        wait = remote_tool("probe_async_wait", timeout=60)

        async def together() -> list[Any]:
            return list(await asyncio.gather(*(wait.run(seconds=0.5) for _ in range(20))))

        results = asyncio.run(together())

    assert (info.pool, info.concurrency) == ("asyncio", 50)
    assert {(r["pid"], r["thread"]) for r in results} == {(pid, "toolexec-asyncio")}
    assert _most_at_once([(r["began"], r["ended"]) for r in results]) == 20


def test_toolexec_worker_with_no_options_starts_the_prefork_worker(
    probe_env: dict[str, str], redis_client: redis.Redis, tool_client: ToolClient, tmp_path: Path
) -> None:
    env = {**os.environ, **probe_env}
    for name in ("TOOLEXEC_WORKER_POOL", "CELERY_CUSTOM_WORKER_POOL"):
        env.pop(name, None)
    argv = [sys.executable, "-m", "toolexec", "worker"]
    with ChildProcess("plain", argv, env=env, cwd=PROJECT_ROOT, log_dir=tmp_path) as worker:
        info, pid = _beating(worker, redis_client), worker.pid
        ran = remote_tool("probe_thread", timeout=30)()

    assert info.pool == "prefork"
    assert ran["pid"] != pid  # a pool child ran it, not the worker's own process
    assert ran["thread"] == "MainThread"


@pytest.mark.parametrize("loop_reads", ["true", "false"])
@pytest.mark.parametrize("task", [TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE])
def test_an_asyncio_worker_with_c_n_runs_n_calls_at_once_with_a_prefetch_count_of_n(
    start_worker: Callable[..., WorkerProcess],
    redis_client: redis.Redis,
    settings: Settings,
    task: str,
    loop_reads: str,
) -> None:
    n = 12
    worker = start_worker(concurrency=n, env={"TOOLEXEC_LOOP_READS": loop_reads})
    assert worker.info is not None
    control = Celery("inspect", set_as_current=False)
    control.conf.update(broker_url=settings.broker_url, broker_connection_retry_on_startup=True)
    inspect = control.control.inspect(destination=[worker.info.hostname], timeout=5)
    reply_to = f"aiotest-{uuid.uuid4().hex}"
    calls = [
        CallRequest(
            call_id=uuid.uuid4().hex,
            tool="probe_async_wait",
            # The first wave awaits long enough for `celery inspect` (up to 5 s a question
            # on a loaded machine) to see it running; the second is short.
            arguments={"seconds": 8.0 if i < n else 0.5},
            reply_to=reply_to,
            deadline=time.time() + 60,
        )
        for i in range(2 * n)
    ]
    redis_client.lpush(
        QUEUE,
        *(redis_envelope(c, queue=QUEUE, headers=task_headers(c, task_name=task)) for c in calls),
    )

    # While the first n await: n running on the worker.
    assert wait_until(lambda: len(_active(inspect)) == n, timeout=15), _active(inspect)
    if task == TASK_AT_LEAST_ONCE or loop_reads == "true":
        # Unacknowledged until they end: prefetch holds back no more than the n running,
        # and the second wave waits in Redis, where another worker could take it. Read
        # by the pool's loop, a read takes no more than the free slots, whenever the call
        # is acknowledged: an at-most-once call's second wave waits in Redis too.
        held, queued = _reserved(inspect), int(redis_client.llen(QUEUE))
        assert (held, queued) == ([], n)
    else:
        # Acknowledged as they start (Celery's prefetch counts unacknowledged messages):
        # the worker also takes the next n, which wait for a slot.
        assert wait_until(
            lambda: len(_reserved(inspect)) == n and redis_client.llen(QUEUE) == 0, timeout=10
        )
    stats = inspect.stats() or {}
    outcomes = _replies(redis_client, reply_to, 2 * n, timeout=30)

    assert stats[worker.info.hostname]["prefetch_count"] == n
    assert len(outcomes) == 2 * n and all(o.ok for o in outcomes)
    spans = [(o.result["began"], o.result["ended"]) for o in outcomes]
    assert _most_at_once(spans) == n  # n really in flight at once, and never more


def _active(inspect: Any) -> list[Any]:
    answer = inspect.active() or {}
    return [request for requests in answer.values() for request in requests]


def _reserved(inspect: Any) -> list[Any]:
    answer = inspect.reserved() or {}
    return [request for requests in answer.values() for request in requests]


@pytest.mark.parametrize("loop_reads", ["true", "false"])
def test_the_pool_reads_its_queues_on_its_own_loop_unless_told_not_to(
    start_worker: Callable[..., WorkerProcess],
    settings: Settings,
    tool_client: ToolClient,
    loop_reads: str,
) -> None:
    worker = start_worker(concurrency=10, env={"TOOLEXEC_LOOP_READS": loop_reads})
    assert worker.info is not None
    wait = remote_tool("probe_async_wait", timeout=30)

    async def calls() -> list[Any]:
        return await asyncio.gather(*(wait.run(seconds=0.05) for _ in range(30)))

    results = [wait(seconds=0.0) for _ in range(5)] + asyncio.run(calls())
    stats = _pool_stats(settings, worker)

    assert len(results) == 35 and all(r["thread"] == "toolexec-asyncio" for r in results)
    read = stats["loop-reads"]
    if loop_reads == "true":
        assert read["messages"] == 35  # every call, none read by Celery's consumer
        assert 1 <= read["reads"] <= 35
    else:
        assert read == {"messages": 0, "reads": 0}


def test_a_queue_added_with_celery_control_is_read_by_the_pool(
    start_worker: Callable[..., WorkerProcess],
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    # Celery's add_consumer changes the task consumer's queues; the pool's reader reads
    # what it consumes.
    worker = start_worker(concurrency=10)
    assert worker.info is not None
    host = worker.info.hostname
    extra = f"aio-extra-{uuid.uuid4().hex[:8]}"
    reply_to = f"aiotest-{uuid.uuid4().hex}"
    call = CallRequest(
        call_id=uuid.uuid4().hex,
        tool="probe_async_wait",
        arguments={"seconds": 0.0},
        reply_to=reply_to,
        deadline=time.time() + 60,
    )
    try:
        redis_client.lpush(
            extra,
            redis_envelope(
                call, queue=extra, headers=task_headers(call, task_name=TASK_AT_MOST_ONCE)
            ),
        )
        control = _control(settings).control
        # Celery's broadcasts reach a worker only once its control consumer has subscribed,
        # a moment after its heartbeat: it answers a ping from then on.
        assert wait_until(lambda: control.ping(destination=[host], timeout=1), timeout=30)
        answer = control.add_consumer(extra, destination=[host], reply=True)
        outcomes = _replies(redis_client, reply_to, 1, timeout=30)
    finally:
        redis_client.delete(extra)

    assert answer and "ok" in answer[0][host]
    assert [o.ok for o in outcomes] == [True]
    assert _pool_stats(settings, worker)["loop-reads"]["messages"] == 1


def _control(settings: Settings) -> Celery:
    control = Celery("inspect", set_as_current=False)
    control.conf.update(broker_url=settings.broker_url, broker_connection_retry_on_startup=True)
    return control


def _pool_stats(settings: Settings, worker: WorkerProcess) -> dict[str, Any]:
    assert worker.info is not None
    inspect = _control(settings).control.inspect(destination=[worker.info.hostname], timeout=5)
    stats = inspect.stats() or {}
    pool: dict[str, Any] = stats[worker.info.hostname]["pool"]
    return pool
