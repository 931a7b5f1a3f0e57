"""A frozen, killed or restarted Redis, under real workers and a real client.

Each test runs its own Redis server with an append-only file (so a restart brings its
data back), its own worker and its own client. Faults are real: the server process is
stopped with ``SIGSTOP`` (frozen: connections stay open, nothing is answered) or killed
with ``SIGKILL`` and started again on the same port and directory.

What they prove: a send whose fate is unknown is sent again and the call still runs
once; a call that may have reached Redis is never reported as "not sent"; a call that
provably was not sent says so, but only at its deadline, and is retried until then; and
a Redis blip costs no call. That a frozen Redis holds no caller past its deadline and
no event loop at all: ``test_frozen_redis.py``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from agent_client import (
    BrokerUnavailable,
    RemoteTool,
    RemoteToolError,
    ToolClient,
    ToolOutcomeUnknown,
    ToolTimeoutError,
    remote_tool,
    run_scope,
)
from tests.redis_stats import calls_of
from toolexec import Pool, RedisServer
from wire.settings import Settings

from .outage_support import SLACK, frozen, what_redis_holds_of
from .polling import wait_until

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

# -- 1. an unknown outcome is never reported as "not sent" --------------------------------


def test_a_call_written_into_a_frozen_redis_is_sent_again_and_runs_once(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    count = remote_tool("probe_count", timeout=15, client=own_client)
    assert count(key=f"probetest:warm:{uuid.uuid4().hex}") == 1  # connections made
    counter = f"probetest:count:{uuid.uuid4().hex}"
    scripts, pushes = calls_of(own_store, "evalsha"), calls_of(own_store, "lpush")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with frozen(own_server):
            call = pool.submit(count, key=counter)
            # The write went out, Redis answered nothing, and the client gave it up as
            # unknown: it now sends the call again for as long as Redis stays frozen.
            assert wait_until(lambda: "sending again" in caplog.text, timeout=10), caplog.text
            assert not call.done()
        assert call.result(timeout=15) == 1

    # Both sends ran once Redis woke up (the first from its socket buffer); the sent
    # marker let only the first push the message, so the tool ran once.
    assert calls_of(own_store, "evalsha") - scripts >= 2
    assert calls_of(own_store, "lpush") - pushes == 1
    assert int(own_store.get(counter) or 0) == 1


def test_an_idempotent_call_written_into_a_frozen_redis_runs_once(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        **own_env,
        "TOOLEXEC_TOOL_MODULES": own_env["TOOLEXEC_TOOL_MODULES"] + ",tests.integration.idem_tools",
    }
    worker_factory(pool="prefork", concurrency=2, queues=("default", "idem"), env=env)
    count = remote_tool("idem_count", timeout=15, client=own_client)
    assert count.idempotent
    assert count(counter=f"probetest:warm:{uuid.uuid4().hex}")["runs"] == 1
    counter = f"probetest:count:{uuid.uuid4().hex}"

    def in_a_run() -> Any:
        with run_scope():
            return count(counter=counter)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with frozen(own_server):
            call = pool.submit(in_a_run)
            assert wait_until(lambda: "sending again" in caplog.text, timeout=10), caplog.text
        result = call.result(timeout=15)

    # The claim sent twice: the first claimed and queued the call, the second joined it.
    assert result["runs"] == 1
    assert int(own_store.get(counter) or 0) == 1


def test_a_call_that_may_have_reached_redis_is_never_reported_as_not_sent(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
) -> None:
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    count = remote_tool("probe_count", timeout=1.0, client=own_client)
    assert count(key=f"probetest:warm:{uuid.uuid4().hex}") == 1
    counter = f"probetest:count:{uuid.uuid4().hex}"
    pushes = calls_of(own_store, "lpush")

    with frozen(own_server):
        started = time.monotonic()
        with pytest.raises(ToolOutcomeUnknown) as raised:
            count(key=counter)
        elapsed = time.monotonic() - started

    assert not isinstance(
        raised.value, BrokerUnavailable
    )  # a retry-on-unavailable never re-sends it
    assert 1.0 <= elapsed <= 1.0 + SLACK, f"took {elapsed:.3f}s of a 1 s deadline"
    assert "unknown" in str(raised.value) and "probe_count" in str(raised.value)
    # It had indeed reached Redis: once awake, Redis queued it (so "not sent" would have
    # been false), and the worker shed it as expired, since its caller had left.
    assert wait_until(lambda: calls_of(own_store, "lpush") - pushes == 1), (
        "the written call never arrived"
    )
    assert wait_until(lambda: own_store.llen("default") == 0)
    assert own_store.get(counter) is None


def test_a_call_that_cannot_connect_is_sent_when_redis_comes_back_within_its_deadline(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    echo = remote_tool("probe_echo", timeout=20, client=own_client)
    assert echo(text="warm", number=0)["text"] == "warm"

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        own_server.kill()  # the port is closed: nothing can be written
        call = pool.submit(echo, text="patient", number=1)
        # The client finds Redis gone: at connecting, or (a connection it still held)
        # at writing; either way it sends again until Redis answers.
        assert wait_until(
            lambda: (
                "cannot connect to Redis" in caplog.text or "cannot take calls now" in caplog.text
            ),
            timeout=10,
        ), caplog.text
        assert not call.done()
        own_server.start()  # same port, same data
        assert call.result(timeout=20)["text"] == "patient"


# -- 2. a Redis blip costs no call -------------------------------------------------------

#: The soaks: calls in flight at once, and each one's deadline.
_IN_FLIGHT, _DEADLINE = 100, 15.0
#: Seconds Redis stays down.
_OUTAGE = 0.5


def _soak(
    tool: RemoteTool,
    calls: int,
    arguments: Callable[[int], dict[str, Any]],
    outage: Callable[[], None],
) -> list[tuple[Any, float]]:
    """``calls`` calls of ``tool``, :data:`_IN_FLIGHT` at once; ``outage`` runs in a thread
    once a third of them are done. Per call: its result or the RemoteToolError it
    raised, and how long it took."""
    a_third_done = threading.Event()

    def when_a_third_is_done() -> None:
        if a_third_done.wait(120):
            outage()

    async def soak() -> list[tuple[Any, float]]:
        gate = asyncio.Semaphore(_IN_FLIGHT)
        done = 0

        async def one(i: int) -> tuple[Any, float]:
            nonlocal done
            async with gate:
                started = time.monotonic()
                try:
                    return await tool.invoke(arguments(i)), time.monotonic() - started
                except RemoteToolError as exc:
                    return exc, time.monotonic() - started
                finally:
                    done += 1
                    if done == calls // 3:
                        a_third_done.set()

        return await asyncio.gather(*(one(i) for i in range(calls)))

    fault = threading.Thread(target=when_a_third_is_done)
    fault.start()
    try:
        return asyncio.run(soak())
    finally:
        a_third_done.set()
        fault.join(60)


def _failures(outcomes: list[tuple[Any, float]]) -> dict[str, int]:
    failures: dict[str, int] = {}
    for outcome, _ in outcomes:
        if isinstance(outcome, RemoteToolError):
            failures[type(outcome).__name__] = failures.get(type(outcome).__name__, 0) + 1
    return failures


def test_a_half_second_freeze_of_redis_costs_no_call_of_three_thousand(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
) -> None:
    worker_factory(pool="prefork", concurrency=4, env=own_env)
    echo = remote_tool("probe_echo", timeout=_DEADLINE, client=own_client)
    assert not echo.idempotent and echo.spec.delivery == "at_most_once"
    assert echo(text="warm", number=0)["text"] == "warm"
    froze: list[float] = []

    def freeze() -> None:
        with frozen(own_server):
            started = time.monotonic()
            time.sleep(_OUTAGE)  # the outage's length: a duration, not a condition
            froze.append(time.monotonic() - started)

    calls = 3000
    outcomes = _soak(echo, calls, lambda i: {"text": f"soak-{i}", "number": i}, freeze)

    assert froze and froze[0] >= _OUTAGE, "Redis was not frozen mid-run"
    assert _failures(outcomes) == {}, f"{sum(_failures(outcomes).values())} of {calls} calls failed"
    assert [o["number"] for o, _ in outcomes] == list(range(calls))
    assert all(o["text"] == f"soak-{o['number']}" for o, _ in outcomes)


def test_a_half_second_redis_restart_with_its_data_costs_no_call_and_never_says_worker_lost(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # "With its data": every write Redis acknowledged is on disk before the kill (with
    # appendfsync everysec a lagging fsync may lose the last two seconds of them).
    own_store.config_set("appendfsync", "always")
    worker = worker_factory(pool="prefork", concurrency=4, env=own_env)
    echo = remote_tool("probe_echo", timeout=_DEADLINE, client=own_client)
    assert echo(text="warm", number=0)["text"] == "warm"
    restarted: list[float] = []

    def restart() -> None:
        own_server.kill()  # SIGKILL: no goodbye; the append-only file keeps what it acknowledged
        down = time.monotonic()
        time.sleep(_OUTAGE)  # the outage's length: a duration, not a condition
        own_server.start()
        restarted.append(time.monotonic() - down)

    calls = 3000
    outcomes = _soak(echo, calls, lambda i: {"text": f"soak-{i}", "number": i}, restart)

    assert restarted and restarted[0] >= _OUTAGE, "Redis was not restarted mid-run"
    assert worker.is_running
    # Sends that could not reach Redis were sent again, calls waiting re-attached to
    # their replies, messages the worker had taken went back on the queue: no call was
    # "not sent", none hung to its deadline, none was lost with a worker, since none
    # died. One loss Redis itself can cause: the messages it popped for the worker's read
    # (one BLMPOP of at most its free prefetch room: 4) just before the kill, whose reply
    # never left it. Such a call may or may not have run, and its caller hears exactly
    # that (ToolOutcomeUnknown), within seconds.
    failures = _failures(outcomes)
    timed_out = [o.call_id for o, _ in outcomes if isinstance(o, ToolTimeoutError) and o.call_id]
    held = what_redis_holds_of(
        own_store, timed_out, worker.log_path.read_text(errors="replace"), caplog.text
    )
    assert set(failures) <= {"ToolOutcomeUnknown"}, f"{failures}\n{held}"
    assert failures.get("ToolOutcomeUnknown", 0) <= 4, (
        failures
    )  # one read of the worker's, one restart
    unknown = [(o, took) for o, took in outcomes if isinstance(o, ToolOutcomeUnknown)]
    assert all(
        "no worker of its queue died" in str(o) and took < _DEADLINE / 2 for o, took in unknown
    ), unknown
    results = [o for o, _ in outcomes if not isinstance(o, RemoteToolError)]
    assert all(o["text"] == f"soak-{o['number']}" for o in results)
    assert len(results) >= calls - 4


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads", "asyncio"])
def test_calls_a_worker_had_taken_but_not_started_when_redis_restarts_run_once(
    pool: Pool,
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
    tmp_path: Path,
) -> None:
    # The worker has taken more calls than it runs at once (prefetch, or the solo pool's
    # one at a time behind a batched read). When Redis restarts, the ones it had not
    # started go back on the queue (executor.seams.put_back) and are taken again: the copies
    # still in the worker's memory must not run as well.
    own_store.config_set("appendfsync", "always")  # the queue survives the restart
    env = {
        **own_env,
        "TOOLEXEC_TOOL_MODULES": (
            f"{own_env['TOOLEXEC_TOOL_MODULES']},tests.integration.restart_tools"
        ),
    }
    worker_factory(pool=pool, concurrency=2, queues=("restart",), env=env)
    nap = remote_tool("restart_nap", timeout=60, client=own_client)
    nap(path=str(tmp_path / "warm.log"), seconds=0)
    runs = tmp_path / "runs.log"
    calls = 8

    def started() -> list[str]:
        return [line.split()[0] for line in runs.read_text().splitlines()] if runs.exists() else []

    with concurrent.futures.ThreadPoolExecutor(calls) as threads:
        futures = [threads.submit(nap, path=str(runs), seconds=1.0) for _ in range(calls)]
        assert wait_until(lambda: len(started()) >= 1, 20), "no call started"
        own_server.kill()  # SIGKILL; the append-only file keeps the queue
        own_server.start()
        outcomes = [future.exception(timeout=90) or future.result() for future in futures]

    ran = collections.Counter(started())
    assert set(ran.values()) <= {1}, (ran, runs.read_text())  # no call ran twice
    # The one loss Redis itself can cause (docs/guarantees.md): the messages it popped for
    # the worker's read just before the kill, whose reply never left it. Their callers
    # hear exactly that; every other call ran once and got its result.
    unknown = [o for o in outcomes if isinstance(o, ToolOutcomeUnknown)]
    assert len(unknown) <= 2, outcomes  # one read: at most the worker's prefetch room
    assert all(isinstance(o, int | ToolOutcomeUnknown) for o in outcomes), outcomes
    assert len(ran) >= calls - len(unknown), (ran, outcomes)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_proxy_built_while_redis_is_down_calls_until_its_deadline_and_gets_its_result(
    mode: str,
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
) -> None:
    # remote_tool(name, timeout=...)(...) in one expression, as the README writes it, with
    # the client's cached catalog view past its age: the read fails, and the proxy is
    # built from what the last read saw; the call is then sent until Redis is back.
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    assert (
        remote_tool("probe_echo", timeout=10, client=own_client)(text="warm", number=0)["text"]
        == "warm"
    )
    time.sleep(1.0)  # the cached view's age (at most 1 s): a duration, not a condition
    own_server.kill()
    back = threading.Timer(1.5, own_server.start)  # the outage's length: a duration
    back.start()
    try:
        started = time.monotonic()
        if mode == "sync":
            result = remote_tool("probe_echo", timeout=20, client=own_client)(text="down", number=1)
        else:
            result = asyncio.run(
                remote_tool("probe_echo", client=own_client).invoke(
                    {"text": "down", "number": 1}, timeout=20
                )
            )
        took = time.monotonic() - started
    finally:
        back.join()
    assert result["text"] == "down"
    assert took >= 1.0, f"the call ended after {took:.2f}s, before Redis was back"


def test_a_call_in_flight_when_redis_restarts_re_attaches_to_its_reply(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
) -> None:
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    sleeper = remote_tool("probe_sleep", timeout=20, client=own_client)
    marker = f"probetest:pid:{uuid.uuid4().hex}"

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(sleeper, seconds=3, marker=marker)
        assert wait_until(lambda: own_store.exists(marker)), "the call never started"
        own_server.kill()  # mid-call; back, with its data, before the tool finishes
        own_server.start()
        assert call.result(timeout=20)["slept"] == 3


def test_heartbeats_that_lapse_while_redis_is_down_kill_no_call_and_run_none_twice(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
) -> None:
    # Redis is down for longer than a heartbeat's TTL and comes back with its data (a
    # SIGTERM writes the append-only file): every worker's heartbeat key has expired,
    # though every worker lives. Neither the client's watchdog nor a worker beginning a
    # call may take that for a dead holder: each idempotent call runs once and ends
    # in its result.
    env = {
        **own_env,
        "TOOLEXEC_TOOL_MODULES": f"{own_env['TOOLEXEC_TOOL_MODULES']},tests.integration.idem_tools",
    }
    for _ in range(2):
        worker_factory(pool="prefork", concurrency=4, queues=("idem_kill",), env=env)
    slow = remote_tool("idem_slow_alo", timeout=_DEADLINE, client=own_client)
    tag = uuid.uuid4().hex
    calls = 8
    interval = Settings.from_env(own_env).heartbeat_interval

    def one(i: int) -> Any:
        with run_scope():  # a run of its own: one execution per call
            return slow(
                counter=f"outage:{tag}:{i}", seconds=6 * interval, marker=f"outage:{tag}:pid:{i}"
            )

    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        futures = [pool.submit(one, i) for i in range(calls)]
        assert wait_until(
            lambda: all(own_store.exists(f"outage:{tag}:pid:{i}") for i in range(calls)), 30
        ), f"the calls never started: {[f.exception() for f in futures if f.done()]}"
        own_server.stop()
        down = time.monotonic()
        time.sleep(3 * interval)  # the outage's length: a duration, not a condition
        own_server.start()
        assert time.monotonic() - down > interval
        results = [future.result(timeout=_DEADLINE + 5) for future in futures]

    assert [r["runs"] for r in results] == [1] * calls
    with redis.Redis.from_url(own_server.url) as after:
        assert [int(after.get(f"outage:{tag}:{i}") or 0) for i in range(calls)] == [1] * calls
