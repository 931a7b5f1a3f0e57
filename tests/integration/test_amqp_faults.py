"""The broker's rainy path on RabbitMQ as on Redis: dead workers, lost confirms, poison, keys.

Like ``test_brokers.py``, the ``broker`` fixture runs a test on the session's private
Redis and on the machine's RabbitMQ (127.0.0.1:5672), the catalog, replies and
idempotency records staying in that Redis; ``amqp`` runs one on RabbitMQ only (its
Redis twin lives elsewhere, named in its docstring). Workers are real ``celery -A
executor worker`` processes serving ``amqp_fault_tools.py`` on a queue unique to the
session, deleted from RabbitMQ at its end. Workers are killed for real (SIGKILL of the
whole process group); RabbitMQ itself, shared with others, is never stopped: a test that
needs it unreachable or mute puts a proxy of its own in between.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from kombu.messaging import Producer

from agent_client import (
    ToolClient,
    ToolExecutionError,
    ToolOutcomeUnknown,
    WorkerLost,
    remote_tool,
)
from agent_client._io.amqp_lane import queue_entity
from agent_client.runs import idempotency_key
from toolexec import Pool, RedisServer, WorkerProcess
from wire import keys
from wire.formats import parse_holder_tag
from wire.settings import Settings

from .broker_support import AMQP_URL, QUEUE_VARIABLE, amqp_connection, delete_amqp_queues
from .polling import wait_until

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

TOOL_MODULES = "tests.integration.amqp_fault_tools"
_PREFIX = "amqpfault:"
#: Text inside every poison message: the worker's log must never contain it.
MARK = "p0is0n-" + uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class Broker:
    """One broker under test, the environment of its workers and clients, and the queue."""

    name: str
    url: str
    env: dict[str, str]
    queue: str

    def client(self, **overrides: str) -> ToolClient:
        """A client of its own with ``overrides`` in its environment; close it."""
        return ToolClient(Settings.from_env({**self.env, **overrides}))

    def purge(self, store: redis.Redis) -> None:
        """Empty the queue of what an earlier test left in it."""
        if self.name == "redis":
            store.delete(self.queue)
            return
        with amqp_connection() as connection:
            channel = connection.channel()
            with contextlib.suppress(*connection.channel_errors):  # not declared yet: empty
                channel.queue_purge(self.queue)

    def ready(self, store: redis.Redis) -> int:
        """Messages waiting in the queue (RabbitMQ: ready, not taken by a consumer)."""
        if self.name == "redis":
            return int(store.llen(self.queue))
        with amqp_connection() as connection:
            _, count, _ = connection.channel().queue_declare(self.queue, passive=True)
            return int(count)


@pytest.fixture(scope="session")
def fault_prefix() -> Iterator[str]:
    """This session's queue prefix; its queue is deleted from RabbitMQ at the end."""
    prefix = f"amqpf_{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_amqp_queues([f"{prefix}_faults"])


def _broker(
    name: str, settings_env: dict[str, str], redis_server: RedisServer, prefix: str
) -> Broker:
    url = redis_server.url if name == "redis" else AMQP_URL
    env = {
        **settings_env,
        "TOOLEXEC_BROKER_URL": url,
        "TOOLEXEC_TOOL_MODULES": TOOL_MODULES,
        QUEUE_VARIABLE: prefix,
    }
    return Broker(name=name, url=url, env=env, queue=f"{prefix}_faults")


@pytest.fixture(params=["redis", "amqp"])
def broker(
    request: pytest.FixtureRequest,
    settings_env: dict[str, str],
    redis_server: RedisServer,
    fault_prefix: str,
    redis_client: redis.Redis,
) -> Broker:
    """The broker under test, its queue emptied."""
    chosen = _broker(request.param, settings_env, redis_server, fault_prefix)
    chosen.purge(redis_client)
    return chosen


@pytest.fixture
def amqp(
    settings_env: dict[str, str],
    redis_server: RedisServer,
    fault_prefix: str,
    redis_client: redis.Redis,
) -> Broker:
    """RabbitMQ, its queue emptied."""
    chosen = _broker("amqp", settings_env, redis_server, fault_prefix)
    chosen.purge(redis_client)
    return chosen


@pytest.fixture
def start(broker: Broker, worker_factory: WorkerFactory) -> Callable[..., WorkerProcess]:
    """Starts a concurrency-1 worker on the broker's queue; stopped after the test."""

    def start_worker(pool: Pool = "prefork", **env: str) -> WorkerProcess:
        return worker_factory(
            pool=pool, concurrency=1, queues=(broker.queue,), env={**broker.env, **env}
        )

    return start_worker


@pytest.fixture
def client(broker: Broker) -> Iterator[ToolClient]:
    """A client of the broker under test."""
    tool_client = broker.client()
    yield tool_client
    tool_client.close()


def _key(name: str) -> str:
    return f"{_PREFIX}{name}:{uuid.uuid4().hex}"


def _runs(store: redis.Redis, counter: str) -> int:
    return int(store.get(counter) or 0)


def _held(store: redis.Redis, client: ToolClient, *, started: bool) -> list[str]:
    """The call ids of ``client`` a heartbeat records as held: started (a pid) or waiting."""
    found = []
    for key in store.scan_iter(match=keys.running(f"{client.client_id}-*")):
        record = store.get(key)
        if record is not None and (parse_holder_tag(record)[1] != 0) == started:
            found.append(key.decode().removeprefix(keys.running("")))
    return found


# -- a worker dies the moment it starts a call ---------------------------------------


@pytest.mark.parametrize(
    ("broker", "pool"),
    [
        ("amqp", "prefork"),
        ("amqp", "threads"),
        ("amqp", "solo"),
        ("amqp", "asyncio"),
        ("redis", "prefork"),
    ],
    indirect=["broker"],
)
def test_a_worker_killed_as_its_at_most_once_call_starts_ends_it_in_worker_lost_without_a_deadline(
    broker: Broker,
    pool: Pool,
    start: Callable[..., WorkerProcess],
    client: ToolClient,
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    """The worker's whole process group is SIGKILLed by the tool itself, the moment it
    starts: before any heartbeat names the call. On RabbitMQ the call was acknowledged
    (or is delivered again): only the holder recorded before either tells the caller."""
    victim = start(pool)
    die = remote_tool("fault_die_first", timeout=None, client=client)  # no deadline at all
    assert die.spec.delivery == "at_most_once"
    counter, flag = _key("runs"), _key("flag")
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(die.invoke_sync, {"counter": counter, "flag": flag})
        assert wait_until(lambda: not victim.is_running, timeout=30), (
            "the tool never killed its worker"
        )
        killed = time.monotonic()
        with pytest.raises(WorkerLost):
            call.result(timeout=60)
        heard = time.monotonic() - killed
    assert heard < 8 * settings.heartbeat_interval, f"WorkerLost came {heard:.1f}s after the kill"
    # Nothing runs it again: the next worker takes the queue in order (a copy RabbitMQ
    # delivered again is refused), and a call sent after it is answered.
    start(pool)
    barrier = remote_tool("fault_sleep", client=client)
    assert (
        barrier.invoke_sync({"counter": _key("barrier"), "seconds": 0.0}, timeout=30)["runs"] == 1
    )
    assert _runs(redis_client, counter) == 1, "an at-most-once call ran again"
    assert client.replies.pending == 0


@pytest.mark.parametrize(
    ("broker", "pool"), [("amqp", "prefork"), ("amqp", "solo")], indirect=["broker"]
)
def test_a_worker_killed_as_its_at_least_once_call_starts_hands_it_to_another_worker(
    broker: Broker,
    pool: Pool,
    start: Callable[..., WorkerProcess],
    client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    """tests/integration/test_lost_windows.py's at-least-once case on RabbitMQ, killed for
    real: the message was never acknowledged, RabbitMQ delivers it again, and another
    worker runs it; no deadline."""
    victim = start(pool)
    die = remote_tool("fault_die_first_alo", timeout=None, client=client)
    assert die.spec.delivery == "at_least_once"
    counter, flag = _key("runs"), _key("flag")
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(die.invoke_sync, {"counter": counter, "flag": flag})
        assert wait_until(lambda: not victim.is_running, timeout=30), (
            "the tool never killed its worker"
        )
        survivor = start(pool)
        result = call.result(timeout=60)
    assert result["runs"] == 2  # the killed run, then the one RabbitMQ delivered again
    assert result["pid"] in [survivor.pid, *survivor.child_pids()]


def test_an_at_most_once_call_a_killed_worker_had_taken_but_not_started_runs_at_most_once(
    broker: Broker,
    start: Callable[..., WorkerProcess],
    client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    """A worker of one process holds a second call while it runs the first, then dies.
    RabbitMQ puts the second back (never acknowledged) and the next worker runs it; on
    Redis the worker had popped it, and its caller hears WorkerLost. Neither runs twice."""
    victim = start()
    sleep = remote_tool("fault_sleep", timeout=None, client=client)
    first, second, marker = _key("first"), _key("second"), _key("pid")
    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        running = threads.submit(
            sleep.invoke_sync, {"counter": first, "seconds": 60.0, "marker": marker}
        )
        assert wait_until(lambda: redis_client.exists(marker), timeout=30), (
            "the first call never started"
        )
        waiting = threads.submit(sleep.invoke_sync, {"counter": second, "seconds": 0.0})
        assert wait_until(lambda: _held(redis_client, client, started=False), timeout=10), (
            "the worker never took the second call"
        )
        victim.kill()
        with pytest.raises(WorkerLost):
            running.result(timeout=30)
        start()
        if broker.name == "amqp":
            assert waiting.result(timeout=30)["runs"] == 1
        else:
            with pytest.raises(WorkerLost):
                waiting.result(timeout=30)
    assert _runs(redis_client, first) == 1
    assert _runs(redis_client, second) == (1 if broker.name == "amqp" else 0)


def test_a_killed_worker_s_idempotent_at_most_once_call_is_worker_lost_and_its_claim_freed(
    broker: Broker,
    start: Callable[..., WorkerProcess],
    client: ToolClient,
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    """The whole worker dies mid-call (tests/integration/test_idempotency.py has the
    Redis-only twin): WorkerLost, the claim released, and a retry in the run runs it."""
    victim = start()
    book = remote_tool("fault_book_amo", client=client)
    assert book.idempotent and book.spec.delivery == "at_most_once"
    counter, marker = _key("runs"), _key("pid")
    arguments: dict[str, Any] = {"counter": counter, "seconds": 30.0, "marker": marker}
    run_id = uuid.uuid4().hex
    claim = keys.claim(idempotency_key(run_id, book.name, book.parameters, arguments))
    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(book.invoke_sync, arguments, run_id=run_id, timeout=60)
        assert wait_until(lambda: redis_client.exists(marker), timeout=30), "the call never started"
        assert redis_client.exists(claim), "the call was never claimed"
        victim.kill()
        killed = time.monotonic()
        with pytest.raises(WorkerLost):
            call.result(timeout=50)
        heard = time.monotonic() - killed
    assert heard < 8 * settings.heartbeat_interval, f"WorkerLost came {heard:.1f}s after the kill"
    assert not redis_client.exists(claim), "the lost call's claim was kept"
    start()
    retried = book.invoke_sync({**arguments, "seconds": 0.0}, run_id=run_id, timeout=30)
    # One process takes the queue in order: a second delivery of the killed call would
    # have run before the retry, which would then be run 3.
    assert retried["runs"] == 2 and _runs(redis_client, counter) == 2


# -- a publish whose confirmation never comes ----------------------------------------


class MutingProxy:
    """Forwards one port to RabbitMQ; :meth:`mute` drops all the broker says from then on.

    A muted connection stays open and carries the client's writes to RabbitMQ: its
    publish arrives, its confirmation never does.
    """

    def __init__(self, target_port: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._target = target_port
        self._muted = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def mute(self) -> None:
        """Stop passing the broker's frames to the client."""
        self._muted.set()

    def close(self) -> None:
        """Close the listener and every connection."""
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target), timeout=5)
            server.settimeout(None)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(server, client, self._muted), daemon=True
            ).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, muted: threading.Event | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if muted is None or not muted.is_set():
                    sink.sendall(data)


def test_a_publish_rabbitmq_never_confirmed_is_outcome_unknown_not_not_sent_and_did_reach_it(
    amqp: Broker,
    worker_factory: WorkerFactory,
    redis_client: redis.Redis,
) -> None:
    """The AMQP twin of test_redis_outage's never-reported-as-not-sent test: the message
    reaches RabbitMQ, its basic.ack never reaches the client. At the deadline the caller
    hears ToolOutcomeUnknown, and the call does run."""
    worker_factory(concurrency=1, queues=(amqp.queue,), env=amqp.env)
    proxy = MutingProxy(5672)
    muted = amqp.client(TOOLEXEC_BROKER_URL=f"amqp://guest:guest@127.0.0.1:{proxy.port}//")
    try:
        sleep = remote_tool("fault_sleep", client=muted)
        assert sleep.invoke_sync({"counter": _key("warm"), "seconds": 0.0}, timeout=30)["runs"] == 1
        proxy.mute()
        counter = _key("runs")
        started = time.monotonic()
        # A deadline long enough for a loaded machine's I/O thread to write the publish
        # (under a load of 10 on two cores, a 1 s one ended before the write: truly not
        # sent), so what is tested is the unconfirmed publish, not the machine's speed.
        with pytest.raises(ToolOutcomeUnknown) as raised:
            sleep.invoke_sync({"counter": counter, "seconds": 3.0}, timeout=3.0)
        elapsed = time.monotonic() - started
        assert "not sent" not in str(raised.value)
        assert elapsed < 3.6, f"heard after {elapsed:.2f}s"
        assert wait_until(lambda: _runs(redis_client, counter) == 1, timeout=10), (
            "it never reached RabbitMQ"
        )
    finally:
        proxy.close()
        muted.close()


# -- signing and poison on RabbitMQ --------------------------------------------------


@pytest.mark.parametrize(
    "key", [None, "another-key-" + uuid.uuid4().hex], ids=["unsigned", "another key"]
)
def test_over_rabbitmq_a_call_without_the_workers_signing_key_is_refused_and_dead_lettered(
    key: str | None, amqp: Broker, worker_factory: WorkerFactory, redis_client: redis.Redis
) -> None:
    """tests/integration/test_signing.py on RabbitMQ: refused before the tool runs."""
    worker_key = "signing-key-" + uuid.uuid4().hex
    worker_factory(
        concurrency=1, queues=(amqp.queue,), env={**amqp.env, "TOOLEXEC_SIGNING_KEY": worker_key}
    )
    signed = amqp.client(TOOLEXEC_SIGNING_KEY=worker_key)
    caller = amqp.client(**({} if key is None else {"TOOLEXEC_SIGNING_KEY": key}))
    ran, refused_mark = _key("signed"), _key("refused")
    try:
        assert remote_tool("fault_mark", client=signed).invoke_sync({"key": ran}, timeout=30) == ran
        with pytest.raises(ToolExecutionError) as refused:
            remote_tool("fault_mark", client=caller).invoke_sync({"key": refused_mark}, timeout=20)
    finally:
        signed.close()
        caller.close()
    assert refused.value.remote_type == ("UnsignedCall" if key is None else "SignatureMismatch")
    assert redis_client.exists(ran) and not redis_client.exists(refused_mark)
    entries = [json.loads(raw) for raw in redis_client.lrange(keys.DEADLETTER, 0, -1)]
    mine = [
        e
        for e in entries
        if refused_mark in base64.b64decode(e["payload_b64"]).decode(errors="replace")
    ]
    assert [e["reason"] for e in mine] == ["unsigned" if key is None else "signature_mismatch"]
    assert [e["queue"] for e in mine] == [amqp.queue]


def _poison(queue: str) -> dict[str, tuple[bytes, dict[str, Any]]]:
    """(body, message properties) of each shape a worker must refuse, by name."""
    good_headers = {"task": "toolexec.run_tool", "id": "c-" + uuid.uuid4().hex, "lang": "py"}
    fields = {
        "call_id": "c-" + uuid.uuid4().hex,
        "tool": "fault_mark",
        "reply_to": "nobody",
        "arguments": {"key": MARK},
    }
    json_type = {"content_type": "application/json", "content_encoding": "utf-8"}

    def call(body: Any, **headers: Any) -> tuple[bytes, dict[str, Any]]:
        return json.dumps(body).encode(), {**json_type, "headers": {**good_headers, **headers}}

    good = [[], fields, None]
    return {
        "garbage": (b"garbage " + MARK.encode(), {**json_type, "headers": good_headers}),
        "pickle": (
            b"\x80\x04" + MARK.encode(),
            {
                "content_type": "application/x-python-serialize",
                "content_encoding": "binary",
                "headers": good_headers,
            },
        ),
        "no task header": (
            json.dumps(good).encode(),
            {**json_type, "headers": {"id": "x", "x": MARK}},
        ),
        "an unknown task": call(good, task="celery.no_such_task"),
        "a body that is a number": call(5),
        "a body of the wrong arity": call([[], {"tool": MARK}]),
        "call fields of the wrong types": call(
            [[], {"call_id": 7, "tool": ["x"], "arguments": MARK}, None]
        ),
        "positional arguments": call([[MARK], fields, None]),
        "callbacks": call([[], fields, {"callbacks": [{"task": "celery.ping"}]}]),
        "a time limit that is not a number": call(good, timelimit=[MARK, None]),
    }


def test_over_rabbitmq_every_poison_message_is_dead_lettered_and_the_same_worker_serves_on(
    amqp: Broker, worker_factory: WorkerFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """tests/integration/test_poison.py on RabbitMQ, whose transport hands the worker a
    message, not a Redis item: each shape is refused, acknowledged and dead-lettered."""
    worker = worker_factory(concurrency=2, queues=(amqp.queue,), env=amqp.env)
    pid = worker.pid
    before = sum(int(n) for n in redis_client.hvals(keys.DEADLETTER_COUNT))
    items = _poison(amqp.queue)
    with amqp_connection() as connection:
        producer = Producer(connection.channel(), auto_declare=False)
        queue_entity(amqp.queue)(producer.channel).declare()
        for body, properties in items.values():
            producer.publish(body, exchange="", routing_key=amqp.queue, **properties)
    client = amqp.client()
    try:
        after = _key("after")
        assert (
            remote_tool("fault_mark", client=client).invoke_sync({"key": after}, timeout=30)
            == after
        )
    finally:
        client.close()
    refused = lambda: sum(int(n) for n in redis_client.hvals(keys.DEADLETTER_COUNT)) - before
    assert wait_until(lambda: refused() == len(items), timeout=10), (
        f"{refused()} of {len(items)} refused"
    )
    assert worker.is_running and worker.pid == pid
    assert amqp.ready(redis_client) == 0
    entries = [json.loads(raw) for raw in redis_client.lrange(keys.DEADLETTER, 0, len(items) - 1)]
    assert {e["queue"] for e in entries} == {amqp.queue}
    log = worker.log_path.read_text(errors="replace")
    assert MARK not in log
    assert "Traceback" not in log
