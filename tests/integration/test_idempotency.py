"""Nothing runs twice: idempotent calls against real workers, under every fault we can cause.

The tools live in ``idem_tools.py`` and count their runs in Redis, so "the body ran
once" is a number. Tests on the ``idem`` queue share one prefork worker; the kill tests
start (and kill) their own workers on ``idem_kill``, of every pool for a whole worker's
death. What a delivery of an idempotent call does on each pool (joins, the stored
outcome) is in ``test_pools.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from agent_client import (
    RemoteTool,
    ToolArgumentsInvalid,
    ToolClient,
    ToolExecutionError,
    ToolTimeoutError,
    WorkerLost,
    configure,
    remote_tool,
    run_scope,
)
from agent_client.runs import idempotency_key
from tasks import list_bookings
from tests.redis_stats import calls_of
from toolexec import Pool, RedisServer, WorkerProcess
from wire import keys
from wire.formats import parse_state, stored_state
from wire.models import (
    TASK_AT_MOST_ONCE,
    CallOutcome,
    CallRequest,
    ErrorKind,
    ToolSpec,
)
from wire.settings import Settings

from .conftest import PROJECT_ROOT
from .polling import wait_until
from .raw_calls import push_call, read_replies
from .workers import module_worker

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

IDEM_TOOL_MODULES = "tasks,tests.integration.idem_tools"
#: Counters and markers the test tools write; they expire on their own.
_PREFIX = "idemtest:"


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def idem_env(settings_env: dict[str, str]) -> dict[str, str]:
    """The session's settings plus the idempotency test tools."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": IDEM_TOOL_MODULES}


@pytest.fixture(scope="module")
def idem_worker(
    idem_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One prefork worker (concurrency 4) on the ``idem`` queue, for this module."""
    with module_worker(
        tmp_path_factory, "idem", env=idem_env, concurrency=4, queues=("idem",)
    ) as worker:
        yield worker


@pytest.fixture
def client(idem_env: dict[str, str]) -> Iterator[ToolClient]:
    """This process's client, configured for the private server; closed after."""
    tool_client = configure(Settings.from_env(idem_env))
    yield tool_client
    tool_client.close()


@pytest.fixture
def shared(idem_worker: WorkerProcess, client: ToolClient) -> WorkerProcess:
    """The module's worker, with this test's client configured."""
    return idem_worker


@pytest.fixture
def kill_queue(redis_client: redis.Redis) -> str:
    """The ``idem_kill`` queue, emptied of anything an earlier test left in it."""
    redis_client.delete("idem_kill")
    return "idem_kill"


@dataclass(frozen=True)
class Counter:
    """A Redis key the test tools INCR once per run of their body; call it to read it."""

    key: str
    client: redis.Redis

    def __call__(self) -> int:
        return int(self.client.get(self.key) or 0)


@pytest.fixture
def counter(redis_client: redis.Redis) -> Counter:
    """A fresh counter for this test."""
    return Counter(f"{_PREFIX}count:{uuid.uuid4().hex}", redis_client)


def _marker() -> str:
    return f"{_PREFIX}pid:{uuid.uuid4().hex}"


def _lpush_calls(client: redis.Redis) -> int:
    """LPUSH commands the server ran (also inside scripts): one per published call."""
    return calls_of(client, "lpush")


def _wait_for_pid(client: redis.Redis, marker: str, timeout: float = 15.0) -> int:
    assert wait_until(lambda: client.get(marker) is not None, timeout=timeout), (
        "the call never started"
    )
    return int(client.get(marker) or 0)


# -- one run, many identical calls ------------------------------------------------------


def test_fifty_concurrent_identical_calls_in_one_run_run_the_body_once(
    shared: WorkerProcess, client: ToolClient, counter: Counter
) -> None:
    count = remote_tool("idem_count", timeout=20)
    assert count.idempotent and count.spec.delivery == "at_least_once"

    async def fifty() -> tuple[str, list[Any]]:
        async with run_scope() as run_id:
            calls = (count.invoke({"counter": counter.key, "seconds": 0.5}) for _ in range(50))
            return run_id, await asyncio.gather(*calls)

    run_id, results = asyncio.run(fifty())

    assert counter() == 1
    assert all(r == results[0] for r in results)
    assert results[0]["runs"] == 1
    assert results[0]["run_id"] == run_id  # current_call().run_id is the scope's id
    assert results[0]["idempotency_key"]
    assert client.replies.pending == 0


def test_identical_calls_from_threads_share_one_execution(
    shared: WorkerProcess, counter: Counter
) -> None:
    count = remote_tool("idem_count", timeout=20)
    run_id = uuid.uuid4().hex  # threads do not inherit the scope's context: pass the run
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(
            pool.map(
                lambda _: count.invoke_sync(
                    {"counter": counter.key, "seconds": 0.5}, run_id=run_id
                ),
                range(10),
            )
        )
    assert counter() == 1
    assert all(r == results[0] for r in results)
    assert results[0]["run_id"] == run_id


def test_the_same_call_in_two_runs_runs_twice(shared: WorkerProcess, counter: Counter) -> None:
    count = remote_tool("idem_count", timeout=20)
    with run_scope() as first:
        a = count(counter=counter.key)
    with run_scope() as second:
        b = count(counter=counter.key)
    assert counter() == 2
    assert (a["run_id"], b["run_id"]) == (first, second)
    assert a["idempotency_key"] != b["idempotency_key"]


def test_outside_any_scope_every_call_is_its_own_run(
    shared: WorkerProcess, counter: Counter
) -> None:
    count = remote_tool("idem_count", timeout=20)
    a, b = count(counter=counter.key), count(counter=counter.key)
    assert counter() == 2
    assert a["run_id"] != b["run_id"]
    assert a["idempotency_key"] != b["idempotency_key"]


def test_a_non_idempotent_tool_runs_every_time_even_in_one_run(
    shared: WorkerProcess, counter: Counter
) -> None:
    plain = remote_tool("plain_count", timeout=20)
    assert not plain.idempotent and plain.spec.delivery == "at_most_once"
    with run_scope():
        a, b = plain(counter=counter.key), plain(counter=counter.key)
    assert counter() == 2
    assert a["idempotency_key"] is None and a["token"] != b["token"]


def test_a_repeat_in_a_later_turn_returns_the_stored_outcome_without_dispatching(
    shared: WorkerProcess, counter: Counter, redis_client: redis.Redis
) -> None:
    count = remote_tool("idem_count", timeout=20)
    with run_scope():
        first = count(counter=counter.key)
        pushes = _lpush_calls(redis_client)
        again = count(counter=counter.key)
        assert _lpush_calls(redis_client) == pushes, "the repeat was dispatched"
    assert again == first
    assert counter() == 1
    ttl = redis_client.ttl(keys.state(first["idempotency_key"]))
    assert 0 < ttl <= Settings.from_env({}).outcome_ttl  # the default: 24 h


def test_argument_order_defaults_and_zero_versus_zero_point_zero_share_one_key(
    shared: WorkerProcess, counter: Counter
) -> None:
    count = remote_tool("idem_count", timeout=20)
    c = counter.key
    with run_scope():
        plain = [
            count.invoke_sync({"counter": c}),
            count.invoke_sync({"ratio": 0, "counter": c}),
            count.invoke_sync(
                {"counter": c, "seconds": 0, "ratio": 0.0, "seat": None, "marker": None}
            ),
        ]
        seated = [
            count.invoke_sync({"counter": c, "seat": {}}),
            count.invoke_sync({"seat": {"row": 1}, "counter": c}),
            count.invoke_sync({"counter": c, "seat": {"window": False, "row": 1.0}}),
        ]
    assert plain[0] == plain[1] == plain[2]
    assert seated[0] == seated[1] == seated[2]
    assert plain[0]["token"] != seated[0]["token"]
    assert counter() == 2


def test_an_explicit_idempotency_key_is_used_as_given(
    shared: WorkerProcess, counter: Counter
) -> None:
    count = remote_tool("idem_count", timeout=20)
    key = f"order-{uuid.uuid4().hex}"
    a = count.invoke_sync({"counter": counter.key}, idempotency_key=key)
    b = count.invoke_sync({"counter": counter.key, "ratio": 2.5}, idempotency_key=key)
    assert a == b and a["idempotency_key"] == key
    assert counter() == 1
    with pytest.raises(ValueError, match="not idempotent"):
        remote_tool("plain_count").invoke_sync({"counter": counter.key}, idempotency_key=key)


# -- retries after a timeout ------------------------------------------------------------


def test_a_retry_after_the_execution_finished_returns_its_stored_outcome(
    shared: WorkerProcess, counter: Counter, redis_client: redis.Redis
) -> None:
    count = remote_tool("idem_count")
    arguments = {"counter": counter.key, "seconds": 0.5, "marker": _marker()}
    with run_scope() as run_id:
        state = keys.state(_key_of(count.spec, run_id, arguments))

        def stored() -> bool:
            return parse_state(redis_client.get(state)).outcome is not None

        with pytest.raises(ToolTimeoutError):
            count.invoke_sync(arguments, timeout=0.2)
        # The execution finishes after its caller left, and stores its outcome.
        assert not stored(), "the call finished before its caller timed out"
        assert wait_until(stored), "the outcome was never stored"
        pushes = _lpush_calls(redis_client)
        retried = count.invoke_sync(arguments, timeout=10)
        assert _lpush_calls(redis_client) == pushes
    assert counter() == 1 and retried["runs"] == 1


def test_a_retry_of_a_call_that_expired_in_the_queue_runs_it_once(
    shared: WorkerProcess, counter: Counter, redis_client: redis.Redis
) -> None:
    # Fill the worker's four slots so the first call expires in the queue, unstarted.
    count = remote_tool("idem_count")
    blockers: list[dict[str, Any]] = [
        {"counter": f"{_PREFIX}blocker:{uuid.uuid4().hex}", "seconds": 1.5} for _ in range(4)
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        busy = [pool.submit(count.invoke_sync, b, timeout=20) for b in blockers]
        assert wait_until(lambda: all(redis_client.get(b["counter"]) for b in blockers)), (
            "the blockers never filled the worker's four slots"
        )
        with run_scope() as run_id:
            with pytest.raises(ToolTimeoutError):
                count.invoke_sync({"counter": counter.key}, timeout=0.3)
            # The first call never started, and its claim still stands: the retry
            # joins it, hears that it expired unstarted, and claims the key again.
            assert counter() == 0, "the first call ran: it did not expire in the queue"
            claim = keys.claim(_key_of(count.spec, run_id, {"counter": counter.key}))
            first_call_id = redis_client.get(claim)
            assert first_call_id is not None, "the first call's claim is gone"
            retried = count.invoke_sync({"counter": counter.key}, timeout=20)
        for b in busy:
            b.result()
    assert counter() == 1 and retried["runs"] == 1
    # The execution the retry got is its own, not the first call's delivery.
    assert retried["call_id"].encode() != first_call_id


# -- errors ------------------------------------------------------------------------------


def test_an_error_is_not_stored_by_default_so_a_retry_runs_again(
    shared: WorkerProcess, counter: Counter, redis_client: redis.Redis
) -> None:
    fail = remote_tool("idem_fail", timeout=20)
    with run_scope():
        with pytest.raises(ToolExecutionError, match="run 1 failed"):
            fail(counter=counter.key)
        with pytest.raises(ToolExecutionError, match="run 2 failed"):
            fail(counter=counter.key)
    assert counter() == 2


def test_cache_errors_stores_the_failure_for_repeats(
    shared: WorkerProcess, counter: Counter
) -> None:
    fail = remote_tool("idem_fail_cached", timeout=20)
    with run_scope():
        for _ in range(3):
            with pytest.raises(ToolExecutionError, match="run 1 failed") as raised:
                fail(counter=counter.key)
            assert raised.value.remote_type == "IdemFailure"
    assert counter() == 1


def test_validation_errors_are_never_stored(
    shared: WorkerProcess, client: ToolClient, counter: Counter, redis_client: redis.Redis
) -> None:
    count = remote_tool("idem_count", timeout=20)
    with run_scope(), pytest.raises(ToolArgumentsInvalid):
        count.invoke_sync({"counter": counter.key, "seconds": "soon"})
    # The client refused before it claimed; a refusal by the worker is not stored either.
    key = uuid.uuid4().hex
    call = CallRequest(
        call_id=uuid.uuid4().hex,
        tool="idem_count",
        arguments={"counter": counter.key, "seat": {"row": "x"}},
        reply_to=f"idemtest-{uuid.uuid4().hex}",
        deadline=time.time() + 20,
        idempotency_key=key,
    )
    push_call(redis_client, call, queue="idem")
    outcome = read_replies(redis_client, call.reply_to, 1)[0]
    assert outcome.error is not None and outcome.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert redis_client.exists(keys.state(key), keys.claim(key)) == 0
    assert counter() == 0


# -- duplicate deliveries and other processes --------------------------------------------


def test_two_client_processes_racing_on_the_same_key_run_it_once(
    shared: WorkerProcess, idem_env: dict[str, str], counter: Counter, redis_client: redis.Redis
) -> None:
    # Each process says it is ready, then blocks until the test lets all of them go at once.
    script = (
        "import json, os, sys, time\n"
        "import redis\n"
        "from agent_client import remote_tool\n"
        "tool = remote_tool('idem_count', timeout=30)\n"
        "gate = redis.Redis.from_url(os.environ['TOOLEXEC_REDIS_URL'])\n"
        "gate.rpush(sys.argv[1] + ':ready', os.getpid())\n"
        "assert gate.blpop([sys.argv[1] + ':go'], timeout=30), 'never let go'\n"
        "sent = time.time()\n"
        "result = tool.invoke_sync({'counter': sys.argv[3], 'seconds': 1.0}, run_id=sys.argv[2])\n"
        "print(json.dumps({'result': result, 'sent': sent, 'answered': time.time()}))\n"
    )
    gate, run_id = f"{_PREFIX}gate:{uuid.uuid4().hex}", uuid.uuid4().hex
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, gate, run_id, counter.key],
            env={**os.environ, **idem_env},
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    try:
        ready = wait_until(lambda: redis_client.llen(f"{gate}:ready") == 3, timeout=60)
        redis_client.rpush(f"{gate}:go", *(["go"] * 3))
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        redis_client.delete(f"{gate}:ready", f"{gate}:go")
    assert ready, "the client processes never got ready"
    assert all(p.returncode == 0 for p in procs), [err.decode()[-2000:] for _, err in outputs]
    answers = [json.loads(out) for out, _ in outputs]
    # They raced: every call was sent before any was answered.
    assert max(a["sent"] for a in answers) < min(a["answered"] for a in answers)
    results = [a["result"] for a in answers]
    assert counter() == 1
    assert results[0] == results[1] == results[2]
    assert results[0]["run_id"] == run_id


def test_the_claim_of_a_claimant_that_crashed_expires(
    shared: WorkerProcess,
    idem_env: dict[str, str],
    counter: Counter,
    redis_client: redis.Redis,
) -> None:
    # A client that publishes to a broker apart from its Redis claims first, then
    # publishes: this one dies (SIGKILL) in between, leaving a claim and no message.
    broker = idem_env["TOOLEXEC_BROKER_URL"].replace("127.0.0.1", "localhost")
    script = (
        "import os, signal, sys\n"
        "from agent_client import remote_tool\n"
        "from agent_client._io.redis_lane import RedisLane\n"
        "tool = remote_tool('idem_count')\n"
        "RedisLane._push_claimed = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        "tool.invoke_sync({'counter': sys.argv[2]}, run_id=sys.argv[1], timeout=1.0)\n"
    )
    run_id = uuid.uuid4().hex
    env = {**os.environ, **idem_env, "TOOLEXEC_BROKER_URL": broker, "TOOLEXEC_CLAIM_MARGIN": "0.5"}
    proc = subprocess.run(
        [sys.executable, "-c", script, run_id, counter.key],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    count = remote_tool("idem_count")
    key = keys.claim(_key_of(count.spec, run_id, {"counter": counter.key}))
    assert 0 < redis_client.pttl(key) <= 1500  # deadline 1 s + no hard limit + margin 0.5 s
    # Until it expires, an identical call joins the dead claim and times out.
    with pytest.raises(ToolTimeoutError):
        count.invoke_sync({"counter": counter.key}, run_id=run_id, timeout=0.3)
    assert wait_until(lambda: not redis_client.exists(key), timeout=3.0)
    result = count.invoke_sync({"counter": counter.key}, run_id=run_id, timeout=10)
    assert result["runs"] == 1 and counter() == 1


def test_a_joined_call_whose_frame_never_came_is_answered_from_the_stored_outcome(
    shared: WorkerProcess, counter: Counter, redis_client: redis.Redis
) -> None:
    # The execution it joined stored its outcome, and its worker died before telling the
    # waiters (the worker stores the outcome, then pushes to the flagged waiters): the
    # claim stands and no frame comes. The watchdog answers it from the store.
    count = remote_tool("idem_count")
    arguments = {"counter": counter.key}
    claimant = f"finished-{uuid.uuid4().hex}"
    with run_scope() as run_id, concurrent.futures.ThreadPoolExecutor(1) as pool:
        key = _key_of(count.spec, run_id, arguments)
        redis_client.set(keys.claim(key), claimant, px=60_000)
        pending = pool.submit(count.invoke_sync, arguments, run_id=run_id, timeout=30)
        assert wait_until(lambda: redis_client.llen(keys.waiters(key)) == 1), "it never joined"
        stored = CallOutcome.success(claimant, {"runs": 1, "call_id": claimant})
        redis_client.set(keys.state(key), stored_state(stored.model_dump_json()), px=60_000)
        stored_at = time.monotonic()
        result = pending.result(timeout=30)
        waited = time.monotonic() - stored_at
    assert result == {"runs": 1, "call_id": claimant}
    assert counter() == 0, "the joined call ran the tool"
    assert waited < 4.0, f"answered {waited:.1f}s after the outcome was stored (interval 1 s)"


def _key_of(spec: ToolSpec, run_id: str, arguments: dict[str, Any]) -> str:
    return idempotency_key(run_id, spec.name, spec.parameters, arguments)


# -- lost pool children and lost workers --------------------------------------------------


def test_a_killed_pool_child_reruns_an_at_least_once_call_at_once(
    worker_factory: WorkerFactory,
    idem_env: dict[str, str],
    kill_queue: str,
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
) -> None:
    worker = worker_factory(concurrency=1, queues=(kill_queue,), env=idem_env)
    slow = remote_tool("idem_slow_alo", timeout=30)
    marker = _marker()
    with concurrent.futures.ThreadPoolExecutor(1) as pool, run_scope() as run_id:
        pending = pool.submit(
            slow.invoke_sync,
            {"counter": counter.key, "seconds": 2.0, "marker": marker},
            run_id=run_id,
        )
        pid = _wait_for_pid(redis_client, marker)
        assert pid in worker.child_pids()
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        result = pending.result(timeout=30)
        elapsed = time.monotonic() - killed
    assert result["runs"] == 2 and counter() == 2  # the killed run, then the re-run
    assert result["pid"] != pid
    assert elapsed < 2.0 + 4.0, f"the re-run finished {elapsed:.1f}s after the kill"


def test_a_killed_pool_child_reports_worker_lost_for_an_at_most_once_call_and_never_reruns(
    worker_factory: WorkerFactory,
    idem_env: dict[str, str],
    kill_queue: str,
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
) -> None:
    worker = worker_factory(concurrency=1, queues=(kill_queue,), env=idem_env)
    slow = remote_tool("idem_slow_amo", timeout=30)
    assert slow.idempotent and slow.spec.delivery == "at_most_once"
    marker = _marker()
    arguments = {"counter": counter.key, "seconds": 10.0, "marker": marker}
    with concurrent.futures.ThreadPoolExecutor(1) as pool, run_scope() as run_id:
        pending = pool.submit(slow.invoke_sync, arguments, run_id=run_id)
        pid = _wait_for_pid(redis_client, marker)
        assert pid in worker.child_pids()
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerLost):
            pending.result(timeout=30)
        elapsed = time.monotonic() - killed
    assert elapsed < 3.0, f"WorkerLost came {elapsed:.1f}s after the kill"
    assert counter() == 1, "an at-most-once call ran again"
    # Nothing is left that would make a later delivery of the key wait for the dead child:
    # WorkerLost is not stored, so the caller's own retry runs the tool again.
    key = _key_of(slow.spec, run_id, arguments)
    assert redis_client.exists(keys.state(key), keys.claim(key)) == 0
    retried = slow.invoke_sync({**arguments, "seconds": 0.0}, run_id=run_id)
    # The worker runs one call at a time, in queue order: a second delivery of the
    # killed call would have run before the retry, which would then be run 3.
    assert retried["runs"] == 2
    assert counter() == 2, "an at-most-once call ran again"


def _owner(workers: list[WorkerProcess], pid: int) -> WorkerProcess:
    """The worker whose process ``pid`` is: a prefork pool process, or the worker itself."""
    for w in workers:
        if pid == w.pid or pid in w.child_pids():
            return w
    raise AssertionError(f"pid {pid} belongs to none of the workers")


def _start_two(
    worker_factory: WorkerFactory, *, pool: Pool, queue: str, env: dict[str, str]
) -> list[WorkerProcess]:
    """Two concurrency-1 workers of ``pool`` on ``queue``, started side by side."""
    workers = [
        worker_factory(pool=pool, concurrency=1, queues=(queue,), env=env, wait=False)
        for _ in range(2)
    ]
    for worker in workers:
        worker.wait_ready()
    return workers


#: Whole-worker kills on every pool; kombu's ack emulation, a broker setting, on one.
_KILLED_WORKERS = [
    pytest.param("prefork", False, id="prefork"),
    pytest.param("prefork", True, id="prefork-ack-emulation"),
    pytest.param("solo", False, id="solo"),
    pytest.param("threads", False, id="threads"),
    pytest.param("asyncio", False, id="asyncio"),
]


@pytest.mark.parametrize(("pool", "ack_emulation"), _KILLED_WORKERS)
def test_a_killed_worker_hands_an_at_least_once_booking_to_the_other_and_books_once(
    worker_factory: WorkerFactory,
    idem_env: dict[str, str],
    kill_queue: str,
    client: ToolClient,
    redis_client: redis.Redis,
    settings: Settings,
    pool: Pool,
    ack_emulation: bool,
) -> None:
    env = {**idem_env, "TOOLEXEC_ACK_EMULATION": str(ack_emulation).lower()}
    workers = _start_two(worker_factory, pool=pool, queue=kill_queue, env=env)
    book = remote_tool("book_flight_once", timeout=30)
    assert book.idempotent and book.spec.delivery == "at_least_once"
    passenger = f"Ada Lovelace {uuid.uuid4().hex[:8]}"
    marker = _marker()
    arguments = {"flight_id": "BA117", "passenger": passenger, "seconds": 1.5, "marker": marker}
    with concurrent.futures.ThreadPoolExecutor(1) as threads, run_scope() as run_id:
        started = time.monotonic()
        pending = threads.submit(book.invoke_sync, arguments, run_id=run_id)
        pid = _wait_for_pid(redis_client, marker)
        # With ack emulation kombu keeps the message the victim holds, to redeliver it.
        unacked = _unacked(redis_client, kill_queue)
        assert len(unacked) == (1 if ack_emulation else 0)
        victim = _owner(workers, pid)
        victim.kill()
        booking = pending.result(timeout=30)
        elapsed = time.monotonic() - started
        # The dead worker's message, redelivered as kombu would after the visibility
        # timeout, finds the stored outcome; a repeat in the run gets it too.
        for message in unacked:
            redis_client.lpush(kill_queue, message)
        # The survivor runs one call at a time, in queue order: once a call queued
        # behind the redelivered message is answered, that message has been handled.
        barrier = remote_tool("idem_slow_alo", timeout=30)
        barrier.invoke_sync(
            {"counter": f"{_PREFIX}barrier:{uuid.uuid4().hex}", "seconds": 0.0},
            run_id=uuid.uuid4().hex,
        )
        assert redis_client.llen(kill_queue) == 0
        assert wait_until(lambda: not _unacked(redis_client, kill_queue)), (
            "a message was never acked"
        )
        assert book.invoke_sync(arguments, run_id=run_id) == booking
    rows = [r for r in list_bookings(settings.data_dir) if r["passenger"] == passenger]
    assert len(rows) == 1, rows
    assert rows[0]["booking_id"] == booking["booking_id"]
    assert elapsed < 15.0, f"the booking took {elapsed:.1f}s"


def _unacked(client: redis.Redis, queue: str) -> list[str]:
    """The messages for ``queue`` that a worker holds unacknowledged (kombu's record)."""
    held = [json.loads(raw) for raw in client.hvals("unacked")]
    return [json.dumps(message) for message, _exchange, routing_key in held if routing_key == queue]


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads", "asyncio"])
def test_a_killed_worker_reports_worker_lost_for_an_at_most_once_call_within_seconds(
    worker_factory: WorkerFactory,
    idem_env: dict[str, str],
    kill_queue: str,
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
    pool: Pool,
) -> None:
    workers = _start_two(worker_factory, pool=pool, queue=kill_queue, env=idem_env)
    slow = remote_tool("idem_slow_amo", timeout=30)
    marker = _marker()
    arguments = {"counter": counter.key, "seconds": 10.0, "marker": marker}
    with concurrent.futures.ThreadPoolExecutor(1) as threads, run_scope() as run_id:
        pending = threads.submit(slow.invoke_sync, arguments, run_id=run_id)
        pid = _wait_for_pid(redis_client, marker)
        _owner(workers, pid).kill()
        killed = time.monotonic()
        with pytest.raises(WorkerLost):
            pending.result(timeout=30)
        elapsed = time.monotonic() - killed
    assert elapsed < 4.0, f"WorkerLost came {elapsed:.1f}s after the kill"
    assert counter() == 1, "an at-most-once call ran again"
    # Nothing will finish the lost execution, so the caller freed its claim: the next
    # identical call in the run is the caller's decision, and may run (as after a
    # lost pool child).
    claim_key = keys.claim(_key_of(slow.spec, run_id, arguments))
    assert not redis_client.exists(claim_key)


# -- Redis restart ----------------------------------------------------------------------


def test_after_a_restart_of_a_redis_without_persistence_only_the_process_that_saw_an_outcome_keeps_it(  # noqa: E501
    idem_env: dict[str, str], tmp_path: Path
) -> None:
    # Its own server and worker: the session's server stays up for the other tests.
    with RedisServer(directory=tmp_path / "own-redis") as server:
        env = {**idem_env, "TOOLEXEC_BROKER_URL": server.url, "TOOLEXEC_REDIS_URL": server.url}
        worker = WorkerProcess(
            name=f"idem-restart-{uuid.uuid4().hex[:8]}",
            concurrency=1,
            queues=("idem",),
            env=env,
            cwd=PROJECT_ROOT,
            log_dir=tmp_path / "worker",
        )
        with worker:
            own = configure(Settings.from_env(env))
            try:
                count = remote_tool("idem_count", timeout=10)
                with run_scope() as run_id:
                    first = count(counter=f"{_PREFIX}restart")
                    assert count(counter=f"{_PREFIX}restart") == first
                    server.restart()
                    assert wait_until(lambda: _serves(server, "idem_count"), timeout=20)
                    # This process saw the outcome stored, and remembers it.
                    assert count(counter=f"{_PREFIX}restart") == first
                # Another process finds nothing in Redis: it runs the call again.
                other = ToolClient(Settings.from_env(env))
                try:
                    again = RemoteTool(count.spec, timeout=10, client=other).invoke_sync(
                        {"counter": f"{_PREFIX}restart"}, run_id=run_id
                    )
                finally:
                    other.close()
            finally:
                own.close()
    assert again["token"] != first["token"], "the outcome was kept across the restart"
    assert again["idempotency_key"] == first["idempotency_key"]


def _serves(server: RedisServer, tool: str) -> bool:
    try:
        with redis.Redis.from_url(server.url) as client:
            beats = [client.get(k) or b"" for k in client.scan_iter(match=keys.worker("*"))]
    except redis.RedisError:
        return False
    return any(tool.encode() in beat for beat in beats)


# -- keys ------------------------------------------------------------------------------


def test_every_key_toolexec_writes_has_a_ttl_except_the_catalog(
    shared: WorkerProcess, counter: Counter, redis_client: redis.Redis
) -> None:
    count, fail = remote_tool("idem_count"), remote_tool("idem_fail")
    with run_scope():
        count.invoke_sync({"counter": counter.key}, timeout=10)  # runs, stored
        count.invoke_sync({"counter": counter.key}, timeout=10)  # answered from the store
        with pytest.raises(ToolTimeoutError):  # claimed, abandoned, joined below
            count.invoke_sync({"counter": counter.key, "seconds": 1.0}, timeout=0.2)
        count.invoke_sync({"counter": counter.key, "seconds": 1.0}, timeout=10)
        with pytest.raises(ToolExecutionError):
            fail(counter=counter.key)
        remote_tool("plain_count")(counter=counter.key)
    # A reply nobody reads: no client listens on its address, so it stays in Redis.
    unread = CallRequest(
        call_id=uuid.uuid4().hex,
        tool="plain_count",
        arguments={"counter": counter.key},
        reply_to=f"idemtest-{uuid.uuid4().hex}",
        deadline=time.time() + 20,
    )
    push_call(redis_client, unread, queue="idem", task_name=TASK_AT_MOST_ONCE)
    reply = keys.reply(unread.reply_to)
    assert wait_until(lambda: redis_client.exists(reply)), "the worker never answered"
    untimed = [
        k.decode()
        for k in redis_client.scan_iter(match=f"{keys.PREFIX}*", count=1000)
        if k.decode() not in (keys.CATALOG, keys.WORKERS) and redis_client.ttl(k) == -1
    ]
    assert untimed == []
    assert redis_client.ttl(reply) > 0
    assert redis_client.ttl(keys.CATALOG) == -1
    redis_client.delete(reply)
