"""Task events when they are wanted (``TOOLEXEC_TASK_EVENTS``), seen by a real monitor.

Each test runs the real ``toolexec worker`` in a process of its own, on the session's
private Redis, and watches Celery's event exchange as ``celery events`` does: an
``app.events.Receiver`` on the same broker, in a thread, recording every event. The
worker's own ``worker-heartbeat`` events show that the receiver hears it, so an absence
of task events means the worker sent none. Control commands (``enable_events``,
``celery inspect``) go through the broadcast queue, as Celery's command line sends them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import pytest
import redis
from celery import Celery

from agent_client import ToolClient, remote_tool
from toolexec import ChildProcess, Pool, free_port
from wire.settings import Settings

from .conftest import PROJECT_ROOT
from .polling import wait_until
from .test_cli import heartbeat_of, one_line_error, run

pytestmark = pytest.mark.integration

TOOL_MODULES = "tests.integration.event_tools"
QUEUE = "task_events"
TOOL = "echo_event"
#: The task events of one call that succeeded, in the order a worker sends them.
CALL_EVENTS = ("task-received", "task-started", "task-succeeded")


@pytest.fixture(scope="module")
def events_env(settings_env: dict[str, str]) -> dict[str, str]:
    """The settings of this module's workers and client: the events tool."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": TOOL_MODULES}


@pytest.fixture(scope="module")
def client(events_env: dict[str, str]) -> Iterator[ToolClient]:
    """An agent client of the private server."""
    tool_client = ToolClient(Settings.from_env(events_env))
    yield tool_client
    tool_client.close()


@pytest.fixture(scope="module")
def monitor(redis_server: Any) -> Iterator[Celery]:
    """A Celery app on the private broker, for control commands, as ``celery -A ...`` uses it."""
    app = Celery("task-events-monitor", broker=redis_server.url, set_as_current=False)
    yield app
    app.close()


@dataclass(frozen=True)
class Worker:
    """A running ``toolexec worker``, its node name and its log."""

    process: ChildProcess
    hostname: str


@contextmanager
def toolexec_worker(
    env: dict[str, str], tmp_path: Path, *, pool: Pool = "prefork", extra: Sequence[str] = ()
) -> Iterator[Worker]:
    """``toolexec worker -Q task_events -c 2 -P POOL``, ready once its heartbeat is in Redis."""
    name = f"events-{uuid.uuid4().hex[:8]}"
    argv = [
        sys.executable,
        "-m",
        "toolexec",
        "worker",
        "-Q",
        QUEUE,
        "-c",
        "2",
        "-P",
        pool,
        "-n",
        f"{name}@%h",
        *(["--", *extra] if extra else []),
    ]
    process = ChildProcess(
        name, argv, env={**os.environ, **env}, cwd=PROJECT_ROOT, log_dir=tmp_path
    )
    with process, redis.Redis.from_url(env["TOOLEXEC_REDIS_URL"]) as store:
        pid = process.pid
        assert pid is not None
        found = []

        def beating() -> bool:
            info = heartbeat_of(store, pid)
            if info is not None:
                found.append(info)
            return bool(found) or not process.is_running

        assert wait_until(beating, timeout=60), process.log_tail()
        assert found, f"toolexec worker exited:\n{process.log_tail()}"
        yield Worker(process, found[0].hostname)


class EventLog:
    """Every event on the broker's event exchange, recorded by a receiver thread."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._events: list[tuple[float, dict[str, Any]]] = []
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self._record})
        self._thread = threading.Thread(target=self._capture, name="event-log", daemon=True)
        self._failure: BaseException | None = None

    def _record(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._events.append((time.monotonic(), event))

    def _capture(self) -> None:
        try:
            # wakeup: every worker sends a heartbeat at once, as `celery events` asks.
            self._receiver.capture(limit=None, timeout=None, wakeup=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's next look
            self._failure = exc

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._receiver.should_stop = True  # the receiver looks at it every second
        self._thread.join(timeout=10)
        self._connection.release()

    def of(self, hostname: str, *, prefix: str = "", since: float = 0.0) -> list[dict[str, Any]]:
        """The events ``hostname`` sent whose type starts with ``prefix``, received
        after ``since``."""
        assert self._failure is None, f"the event receiver failed: {self._failure!r}"
        with self._lock:
            return [
                event
                for received, event in self._events
                if received > since
                and event.get("hostname") == hostname
                and str(event.get("type", "")).startswith(prefix)
            ]

    def hears(self, hostname: str, *, since: float = 0.0, timeout: float = 15.0) -> bool:
        """Whether a ``worker-heartbeat`` of ``hostname`` arrives after ``since``."""
        return wait_until(
            lambda: self.of(hostname, prefix="worker-heartbeat", since=since), timeout
        )


def settle(monitor: Celery, events: EventLog, hostname: str) -> None:
    """Return once every event ``hostname`` sent for the calls it has finished has arrived.

    ``celery inspect active`` answers from the worker's event loop after each finished
    call's events were handed to its dispatcher; the worker's next heartbeat, forced by
    Celery's ``heartbeat`` control command, goes out on the same connection after them.
    """
    assert wait_until(lambda: active(monitor, hostname) == [], timeout=15), "calls still running"
    answered = time.monotonic()
    monitor.control.broadcast("heartbeat", destination=[hostname])
    assert events.hears(hostname, since=answered), f"no heartbeat of {hostname} after its calls"


def active(monitor: Celery, hostname: str) -> list[dict[str, Any]] | None:
    """``celery inspect active`` of one worker: the calls it runs; None if it did not answer."""
    replies = monitor.control.inspect(timeout=2.0, destination=[hostname]).active() or {}
    found = replies.get(hostname)
    return list(found) if found is not None else None


def call_events(events: EventLog, hostname: str, *, since: float = 0.0) -> dict[str, set[str]]:
    """The ids of the ``echo_event`` calls ``hostname`` sent each of :data:`CALL_EVENTS` for."""
    received = events.of(hostname, prefix="task-", since=since)
    ours = {
        e["uuid"] for e in received if e.get("type") == "task-received" and e.get("name") == TOOL
    }
    return {kind: {e["uuid"] for e in received if e["type"] == kind} & ours for kind in CALL_EVENTS}


def complete(events: EventLog, hostname: str, *, since: float = 0.0) -> bool:
    """Whether some call's task events arrived, all three of them."""
    seen = call_events(events, hostname, since=since)
    return bool(set.intersection(*seen.values()))


def call(client: ToolClient, word: str) -> None:
    assert remote_tool(TOOL, client=client).invoke_sync({"word": word}, timeout=30) == word


# -- auto: none until a monitor asks -----------------------------------------------------


@pytest.mark.parametrize("pool", ["prefork", "asyncio"])
def test_by_default_a_worker_sends_no_task_events_until_enable_events_then_sends_them(
    pool: Pool, events_env: dict[str, str], client: ToolClient, monitor: Celery, tmp_path: Path
) -> None:
    with toolexec_worker(events_env, tmp_path, pool=pool) as worker, EventLog(monitor) as events:
        host = worker.hostname
        assert events.hears(host), "the receiver hears no heartbeat of the worker"
        # Remote control works with events off: ping and inspect.
        assert monitor.control.ping(destination=[host], timeout=2.0) == [{host: {"ok": "pong"}}]
        for word in ("one", "two", "three"):
            call(client, word)
        settle(monitor, events, host)
        assert events.of(host, prefix="task-") == []

        replies = monitor.control.enable_events(destination=[host], reply=True, timeout=2.0)
        assert replies == [{host: {"ok": "task events enabled"}}]
        enabled = time.monotonic()
        call(client, "four")

        assert wait_until(lambda: complete(events, host, since=enabled), timeout=15), call_events(
            events, host, since=enabled
        )
        # And off again, as a monitor may ask.
        replies = monitor.control.disable_events(destination=[host], reply=True, timeout=2.0)
        assert replies == [{host: {"ok": "task events disabled"}}]
        settle(monitor, events, host)
        disabled = time.monotonic()
        call(client, "five")
        settle(monitor, events, host)
        assert events.of(host, prefix="task-", since=disabled) == []
        assert "Traceback" not in worker.process.log_tail()


# -- on: from the start ------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["prefork", "asyncio"])
def test_with_task_events_on_a_worker_sends_them_from_the_start(
    pool: Pool, events_env: dict[str, str], client: ToolClient, monitor: Celery, tmp_path: Path
) -> None:
    env = {**events_env, "TOOLEXEC_TASK_EVENTS": "on"}
    with toolexec_worker(env, tmp_path, pool=pool) as worker, EventLog(monitor) as events:
        host = worker.hostname
        assert events.hears(host), "the receiver hears no heartbeat of the worker"
        call(client, "one")

        assert wait_until(lambda: complete(events, host), timeout=15), call_events(events, host)
        assert active(monitor, worker.hostname) == []


# -- off: never, and a value that is none of the three -------------------------------------


def test_with_task_events_off_a_worker_refuses_enable_events_and_ignores_dash_e(
    events_env: dict[str, str], client: ToolClient, monitor: Celery, tmp_path: Path
) -> None:
    env = {**events_env, "TOOLEXEC_TASK_EVENTS": "off"}
    with toolexec_worker(env, tmp_path, extra=["-E"]) as worker, EventLog(monitor) as events:
        host = worker.hostname
        assert events.hears(host), "the receiver hears no heartbeat of the worker"
        replies = monitor.control.enable_events(destination=[host], reply=True, timeout=2.0)
        assert replies == [
            {host: {"error": "task events are off on this worker (TOOLEXEC_TASK_EVENTS=off)"}}
        ]
        call(client, "one")
        settle(monitor, events, host)

        assert events.of(host, prefix="task-") == []
        assert (
            "TOOLEXEC_TASK_EVENTS=off: this worker sends no task events"
            in worker.process.log_tail()
        )


def test_a_task_events_value_that_is_none_of_auto_on_off_stops_toolexec_worker_naming_the_variable(
    events_env: dict[str, str],
) -> None:
    done = run("worker", "-Q", QUEUE, env=events_env, extra_env={"TOOLEXEC_TASK_EVENTS": "yes"})

    assert done.returncode == 8, done.stderr
    line = one_line_error(done)
    assert "TOOLEXEC_TASK_EVENTS" in line and "'auto', 'on' or 'off'" in line and "'yes'" in line, (
        line
    )


# -- Flower turns them on itself -----------------------------------------------------------


def flower_tasks(base: str) -> dict[str, Any]:
    """Flower's ``/api/tasks``; empty while it does not answer."""
    try:
        with urllib.request.urlopen(base + "/api/tasks", timeout=2.0) as response:
            found: dict[str, Any] = json.loads(response.read())
            return found
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}


def test_flower_shows_the_calls_of_a_worker_started_with_the_default_without_being_told(
    events_env: dict[str, str], client: ToolClient, tmp_path: Path
) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "executor",
        "flower",
        f"--port={port}",
        "--address=127.0.0.1",
    ]
    # Flower 2.x answers its REST API without authentication only when told to.
    env = {**os.environ, **events_env, "FLOWER_UNAUTHENTICATED_API": "true"}
    base = f"http://127.0.0.1:{port}"
    with (
        toolexec_worker(events_env, tmp_path) as worker,
        ChildProcess("flower", argv, env=env, cwd=PROJECT_ROOT, log_dir=tmp_path) as flower,
    ):

        def shown() -> bool:
            # Calls made before Flower's first enable_events (5 s after its start) go unseen.
            assert flower.is_running, flower.log_tail()
            call(client, "seen")
            return any(
                task.get("name") == TOOL
                and task.get("state") == "SUCCESS"
                and task.get("worker") == worker.hostname
                for task in flower_tasks(base).values()
            )

        assert wait_until(shown, timeout=45, interval=0.5), (
            f"Flower lists {flower_tasks(base)}\n{flower.log_tail()}"
        )
