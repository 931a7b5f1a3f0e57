"""Every guarantee that is about the broker, on Redis and on RabbitMQ.

The ``broker`` fixture runs this module twice: with the session's private Redis as the
broker, and with the machine's RabbitMQ (127.0.0.1:5672, through kombu's AMQP
transport) while the catalog, replies and idempotency records stay in that Redis. The
workers are real ``celery -A executor worker`` processes on the broker under test; the
tools (``amqp_tools.py``) are served on queues whose names are unique to the session,
deleted from RabbitMQ at its end. A broker that is down is a port nobody listens on,
or a proxy (``broker_support.TcpProxy``) the test stops: RabbitMQ itself, shared with
others, is never stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
import redis

from agent_client import (
    BrokerUnavailable,
    ToolClient,
    ToolTimeoutError,
    WorkerLost,
    attach,
    remote_tool,
)
from agent_client.runs import idempotency_key
from toolexec import RedisServer, WorkerProcess
from wire import keys
from wire.formats import parse_holder_tag
from wire.settings import Settings

from .broker_support import (
    AMQP_URL,
    QUEUE_VARIABLE,
    TcpProxy,
    amqp_connection,
    delete_amqp_queues,
    queue_names,
)
from .conftest import PROJECT_ROOT
from .polling import wait_until

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

#: The workers' tool modules: the broker tests' tools only.
TOOL_MODULES = "tests.integration.amqp_tools"
#: Counters and markers the tools write (they expire on their own).
_PREFIX = "brokertest:"


@dataclass(frozen=True)
class Broker:
    """One broker under test and the environment of its workers and clients."""

    name: str
    url: str
    env: dict[str, str]
    shared: str
    solo: str

    @property
    def port(self) -> int:
        """The broker's port on 127.0.0.1."""
        port = urlsplit(self.url).port
        assert port is not None
        return port

    def at_port(self, port: int) -> str:
        """The broker's URL with ``port`` in place of its own (a proxy, or nobody)."""
        parts = urlsplit(self.url)
        return parts._replace(netloc=parts.netloc.replace(f":{self.port}", f":{port}")).geturl()

    def client(self, url: str | None = None) -> ToolClient:
        """A client of its own, on ``url`` instead of the broker when given; close it."""
        env = self.env if url is None else {**self.env, "TOOLEXEC_BROKER_URL": url}
        return ToolClient(Settings.from_env(env))

    def purge_solo(self, store: redis.Redis) -> None:
        """Empty the solo queue of what an earlier test left in it."""
        if self.name == "redis":
            store.delete(self.solo)
            return
        with amqp_connection() as connection:
            channel = connection.channel()
            try:
                channel.queue_purge(self.solo)
            except connection.channel_errors:  # not declared yet: empty
                pass


@dataclass(frozen=True)
class Counter:
    """A Redis key the tools INCR once per run; call it to read it."""

    key: str
    client: redis.Redis

    def __call__(self) -> int:
        return int(self.client.get(self.key) or 0)


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def queue_prefix() -> Iterator[str]:
    """This session's queue prefix; its queues are deleted from RabbitMQ at the end."""
    prefix = f"amqp_{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_amqp_queues(queue_names(prefix))


@pytest.fixture(scope="module", params=["redis", "amqp"])
def broker(
    request: pytest.FixtureRequest,
    settings_env: dict[str, str],
    redis_server: RedisServer,
    queue_prefix: str,
) -> Broker:
    """The broker under test: the private Redis, or RabbitMQ with that Redis as the store."""
    url = redis_server.url if request.param == "redis" else AMQP_URL
    env = {
        **settings_env,
        "TOOLEXEC_BROKER_URL": url,
        "TOOLEXEC_TOOL_MODULES": TOOL_MODULES,
        QUEUE_VARIABLE: queue_prefix,
    }
    shared, solo = queue_names(queue_prefix)
    return Broker(name=request.param, url=url, env=env, shared=shared, solo=solo)


@pytest.fixture(scope="module")
def shared_worker(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One prefork worker (concurrency 2) on the shared queue, per broker."""
    worker = WorkerProcess(
        name=f"broker-{broker.name}-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=2,
        queues=(broker.shared,),
        env=broker.env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp(f"broker-{broker.name}"),
    )
    with worker:
        yield worker


@pytest.fixture(scope="module")
def client(broker: Broker) -> Iterator[ToolClient]:
    """An agent client on the broker under test, per broker."""
    tool_client = broker.client()
    yield tool_client
    tool_client.close()


@pytest.fixture
def solo(
    broker: Broker, worker_factory: WorkerFactory, redis_client: redis.Redis
) -> Callable[[], WorkerProcess]:
    """Starts a concurrency-1 worker on the solo queue (emptied first); stopped after the test."""
    broker.purge_solo(redis_client)
    return lambda: worker_factory(concurrency=1, queues=(broker.solo,), env=broker.env)


@pytest.fixture
def counter(redis_client: redis.Redis) -> Counter:
    """A fresh run counter."""
    return Counter(f"{_PREFIX}count:{uuid.uuid4().hex}", redis_client)


def _marker() -> str:
    return f"{_PREFIX}pid:{uuid.uuid4().hex}"


def _started(store: redis.Redis, marker: str, client: ToolClient) -> int:
    """Wait until the call writing ``marker`` runs and its worker's heartbeat records
    that; its PID."""
    assert wait_until(lambda: store.exists(marker), timeout=30), "the call never started"
    pid = int(store.get(marker) or 0)

    def recorded() -> bool:
        for key in store.scan_iter(match=keys.running(f"{client.client_id}-*")):
            holder = store.get(key)
            if holder is not None and parse_holder_tag(holder)[1] == pid:
                return True
        return False

    assert wait_until(recorded, timeout=10), "the worker's heartbeat never recorded the call"
    return pid


def _owner(workers: list[WorkerProcess], pid: int) -> WorkerProcess:
    for worker in workers:
        if pid in worker.child_pids():
            return worker
    raise AssertionError(f"pid {pid} belongs to none of the workers")


# -- calls -----------------------------------------------------------------------------


def test_a_call_travels_over_the_broker_and_its_result_comes_back(
    broker: Broker, shared_worker: WorkerProcess, client: ToolClient
) -> None:
    echo = remote_tool("broker_echo", client=client)

    result = echo.invoke_sync({"text": "Zoë — 東京"}, timeout=30)

    assert result["text"] == "Zoë — 東京"
    assert result["pid"] in shared_worker.child_pids()
    assert result["call_id"].startswith(client.client_id)

    async def many() -> list[dict[str, object]]:
        return list(
            await asyncio.gather(*(echo.invoke({"text": str(i)}, timeout=30) for i in range(20)))
        )

    assert [r["text"] for r in asyncio.run(many())] == [str(i) for i in range(20)]


def test_repeats_of_an_idempotent_call_share_one_execution(
    broker: Broker, shared_worker: WorkerProcess, client: ToolClient, counter: Counter
) -> None:
    count = remote_tool("broker_count", client=client)
    arguments = {"counter": counter.key, "seconds": 0.5}
    run_id = uuid.uuid4().hex

    async def together() -> list[dict[str, object]]:
        calls = (count.invoke(arguments, run_id=run_id, timeout=30) for _ in range(5))
        return list(await asyncio.gather(*calls))

    results = asyncio.run(together())
    later = count.invoke_sync(arguments, run_id=run_id, timeout=30)

    assert counter() == 1
    assert all(r == results[0] for r in [*results, later]), [*results, later]
    # Another run is another call.
    assert count.invoke_sync(arguments, run_id=uuid.uuid4().hex, timeout=30)["runs"] == 2


# -- lost workers ----------------------------------------------------------------------


def test_a_killed_worker_ends_its_at_most_once_call_with_worker_lost_and_nothing_runs_it_again(
    broker: Broker,
    solo: Callable[[], WorkerProcess],
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    victim = solo()
    slow = remote_tool("broker_slow", client=client)
    assert slow.spec.delivery == "at_most_once" and not slow.idempotent
    marker = _marker()
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(
            slow.invoke_sync,
            {"counter": counter.key, "seconds": 30.0, "marker": marker},
            timeout=60,
        )
        _started(redis_client, marker, client)
        victim.kill()  # SIGKILL, the whole process group
        killed = time.monotonic()
        with pytest.raises(WorkerLost):
            call.result(timeout=50)
        heard = time.monotonic() - killed
    assert heard < 8 * settings.heartbeat_interval, f"WorkerLost came {heard:.1f}s after the kill"
    # Nothing runs it again: a new worker takes the queue in order, and a call sent
    # after it is answered at once (a redelivered copy would run 30 s before it).
    solo()
    barrier = slow.invoke_sync({"counter": f"{counter.key}:barrier", "seconds": 0.0}, timeout=20)
    assert barrier["runs"] == 1
    assert counter() == 1


@pytest.mark.parametrize("tool", ["broker_slow_alo", "broker_book_alo"])
def test_a_killed_worker_s_at_least_once_call_runs_again_on_another_worker_once(
    tool: str,
    broker: Broker,
    solo: Callable[[], WorkerProcess],
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
) -> None:
    workers = [solo(), solo()]
    slow = remote_tool(tool, client=client)
    assert slow.spec.delivery == "at_least_once"
    marker = _marker()
    arguments = {"counter": counter.key, "seconds": 2.0, "marker": marker}
    run_id = uuid.uuid4().hex
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(slow.invoke_sync, arguments, run_id=run_id, timeout=60)
        pid = _started(redis_client, marker, client)
        victim = _owner(workers, pid)
        victim.kill()
        result = call.result(timeout=50)
    survivor = next(w for w in workers if w is not victim)
    assert result["pid"] in survivor.child_pids()
    # The killed run and one more: RabbitMQ redelivers the unacknowledged message, on
    # Redis the client's watchdog sends it again; an idempotent call's extra copies
    # (the watchdog's, on RabbitMQ) find it running or stored and do not run it.
    assert result["runs"] == 2
    if slow.idempotent:
        assert slow.invoke_sync(arguments, run_id=run_id, timeout=30) == result
    barrier = remote_tool("broker_slow", client=client)
    barrier.invoke_sync({"counter": f"{counter.key}:barrier", "seconds": 0.0}, timeout=30)
    assert counter() == 2


def test_an_at_least_once_call_that_kills_its_process_every_time_is_given_up_after_the_limit(
    broker: Broker,
    solo: Callable[[], WorkerProcess],
    client: ToolClient,
    counter: Counter,
    settings: Settings,
) -> None:
    worker = solo()
    crash = remote_tool("broker_crash_alo", client=client)
    started = time.monotonic()
    with pytest.raises(WorkerLost, match=f"died {settings.max_deliveries} times running this call"):
        crash.invoke_sync({"counter": counter.key}, timeout=60)
    assert time.monotonic() - started < 20.0
    assert counter() == settings.max_deliveries
    # Given up for good: the worker serves on and the call never ran again.
    barrier = remote_tool("broker_slow", client=client)
    assert (
        barrier.invoke_sync({"counter": f"{counter.key}:b", "seconds": 0.0}, timeout=30)["runs"]
        == 1
    )
    assert counter() == settings.max_deliveries
    assert worker.is_running


# -- deadlines -------------------------------------------------------------------------


def test_a_call_whose_deadline_passes_while_it_waits_in_the_queue_never_runs(
    broker: Broker,
    solo: Callable[[], WorkerProcess],
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
) -> None:
    solo()
    slow = remote_tool("broker_slow", client=client)
    busy = Counter(f"{counter.key}:busy", redis_client)
    marker = _marker()
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        occupied = threads.submit(
            slow.invoke_sync, {"counter": busy.key, "seconds": 3.0, "marker": marker}, timeout=30
        )
        assert wait_until(lambda: redis_client.exists(marker), timeout=30), (
            "the busy call never started"
        )
        with pytest.raises(ToolTimeoutError):
            slow.invoke_sync({"counter": counter.key, "seconds": 0.0}, timeout=0.5)
        occupied.result(timeout=30)
    # The one process takes the queue in order: once a call sent later is answered, the
    # expired one has been taken, and shed.
    slow.invoke_sync({"counter": f"{counter.key}:after", "seconds": 0.0}, timeout=30)
    assert counter() == 0
    assert busy() == 1


# -- the broker away -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_broker_that_is_down_at_send_time_is_broker_unavailable_within_the_deadline(
    mode: str, broker: Broker, shared_worker: WorkerProcess, closed_port: int
) -> None:
    down = broker.client(broker.at_port(closed_port))
    try:
        echo = remote_tool("broker_echo", client=down)
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            if mode == "sync":
                echo.invoke_sync({"text": "hello"}, timeout=1.0)
            else:
                asyncio.run(echo.invoke({"text": "hello"}, timeout=1.0))
        elapsed = time.monotonic() - started
    finally:
        down.close()
    assert 0.9 <= elapsed < 1.6, f"heard after {elapsed:.2f}s"
    message = str(raised.value)
    assert "the call was not sent" in message
    assert ("RabbitMQ" if broker.name == "amqp" else "Redis") in message, message


def test_a_claim_whose_publish_failed_is_released_and_its_caller_hears_broker_unavailable(
    broker: Broker,
    shared_worker: WorkerProcess,
    client: ToolClient,
    counter: Counter,
    redis_client: redis.Redis,
    closed_port: int,
) -> None:
    down = broker.client(broker.at_port(closed_port))
    count = remote_tool("broker_count", client=down)
    arguments = {"counter": counter.key}
    run_id = uuid.uuid4().hex
    claim = keys.claim(idempotency_key(run_id, count.name, count.parameters, arguments))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as threads:
            started = time.monotonic()
            call = threads.submit(count.invoke_sync, arguments, run_id=run_id, timeout=1.0)
            # Claimed in Redis while the publish is tried again until the deadline ...
            claimed = wait_until(lambda: redis_client.exists(claim), timeout=1.0, interval=0.005)
            with pytest.raises(BrokerUnavailable, match="the call was not sent"):
                call.result(timeout=10)
            elapsed = time.monotonic() - started
    finally:
        down.close()
    assert claimed, "the call was never claimed"
    assert elapsed < 1.6, f"heard after {elapsed:.2f}s"
    # ... never published: the claim is released (its TTL is 31 s) ...
    assert wait_until(lambda: not redis_client.exists(claim), timeout=5.0), "the claim was kept"
    # ... so a retry in the run claims it again and runs it, instead of joining a claim
    # that nothing will ever answer.
    result = remote_tool("broker_count", client=client).invoke_sync(
        arguments, run_id=run_id, timeout=30
    )
    assert result["runs"] == 1 and counter() == 1


def test_calls_go_through_again_once_the_broker_is_back(
    broker: Broker, shared_worker: WorkerProcess, tmp_path: Path
) -> None:
    proxy = TcpProxy(broker.port).start()
    through = broker.client(broker.at_port(proxy.port))
    try:
        echo = remote_tool("broker_echo", client=through)
        assert echo.invoke_sync({"text": "before"}, timeout=30)["text"] == "before"
        proxy.stop()  # the broker goes away for this client, and its connection with it
        with pytest.raises(BrokerUnavailable, match="the call was not sent"):
            echo.invoke_sync({"text": "while away"}, timeout=1.0)
        proxy.start()  # back, on the same port
        assert echo.invoke_sync({"text": "after"}, timeout=30)["text"] == "after"
    finally:
        through.close()
        proxy.stop()


# -- a handle you can walk away from ------------------------------------------------------

_WALK_AWAY = """
import os, signal, sys
from agent_client import configure, get_client, remote_tool

how, senders, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in range(senders):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sender: submit, tell the id, and leave at once
        os.close(read)
        configure()
        handle = remote_tool("broker_slow").submit(
            {"counter": f"{prefix}:{i}", "seconds": 0.0}, timeout=60
        )
        os.write(write, handle.id.encode())
        if how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "close":
            get_client().close()
        sys.exit(0)
    os.close(write)
    with os.fdopen(read) as told:
        call_id = told.read()
    _, status = os.waitpid(pid, 0)
    print(call_id, status, flush=True)
"""


@pytest.mark.parametrize("how", ["sigkill", "close", "exit"])
def test_a_call_whose_sender_leaves_the_moment_submit_returns_runs_once_and_is_found(
    how: str,
    broker: Broker,
    solo: Callable[[], WorkerProcess],
    client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    # submit() returns once the call's record and message are confirmed: a sender that
    # leaves right after (SIGKILLed, after closing its client, or just exiting) loses
    # nothing. 20 senders, each its own process.
    solo()
    prefix = f"{_PREFIX}walk:{uuid.uuid4().hex}"
    senders = subprocess.run(
        [sys.executable, "-c", _WALK_AWAY, how, "20", prefix],
        env={**os.environ, **broker.env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert senders.returncode == 0, senders.stderr[-3000:]
    told = [line.split() for line in senders.stdout.splitlines()]
    assert len(told) == 20, senders.stdout
    expected_status = signal.SIGKILL if how == "sigkill" else 0
    assert all(int(status) == expected_status for _, status in told), told
    for i, (call_id, _) in enumerate(told):
        handle = attach(call_id, client=client)  # a sender that never submitted has no id to tell
        assert handle.result_sync(timeout=30)["runs"] == 1, i
        assert handle.status() == "done"
        assert Counter(f"{prefix}:{i}", redis_client)() == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_submit_the_broker_cannot_take_raises_broker_unavailable_by_its_deadline(
    mode: str, broker: Broker, shared_worker: WorkerProcess, closed_port: int
) -> None:
    down = broker.client(broker.at_port(closed_port))
    try:
        echo = remote_tool("broker_echo", client=down)
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            if mode == "sync":
                echo.submit({"text": "hello"}, timeout=1.0)
            else:
                asyncio.run(echo.submit_async({"text": "hello"}, timeout=1.0))
        elapsed = time.monotonic() - started
    finally:
        down.close()
    assert 0.9 <= elapsed < 1.6, f"heard after {elapsed:.2f}s"
    assert "the call was not sent" in str(raised.value)
    assert raised.value.call_id  # the call it gave up, named
