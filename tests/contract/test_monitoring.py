"""``celery inspect`` and Flower see a call the client wrote as they see a send_task call.

One worker with task events on (``-E``) serves ``default``. In each test a call made
through the real client and the same kind of call made with stock ``send_task`` run
side by side, and each monitoring tool must show the two alike: the same fields, the
same task name, ids that are the call ids, and reprs that name the tool only.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from celery import Celery

from agent_client import ToolClient, remote_tool, sent_calls
from toolexec import ChildProcess, WorkerProcess, free_port
from wire import keys
from wire.formats import parse_frame
from wire.models import TASK_AT_MOST_ONCE, CallOutcome, CallRequest

from .conftest import PROJECT_ROOT
from .support import kwargsrepr_of, send_like_the_client, wait_until

#: How long the slow calls work: long enough to inspect them while they run.
SLOW_SECONDS = 3.0


def stock_request(tool: str, arguments: dict[str, Any], *, timeout: float) -> CallRequest:
    """A call for ``send_task``, replying to a client id nobody else uses."""
    return CallRequest(
        call_id=uuid.uuid4().hex,
        tool=tool,
        arguments=arguments,
        reply_to=f"contract-stock-{uuid.uuid4().hex[:8]}",
        deadline=time.time() + timeout,
    )


def stock_outcome(
    redis_client: redis.Redis, request: CallRequest, timeout: float = 15.0
) -> CallOutcome:
    """The outcome the worker pushed for the send_task call ``request``."""
    item = redis_client.blpop([keys.reply(request.reply_to)], timeout=timeout)
    assert item is not None, (
        f"no outcome for the send_task call {request.call_id} within {timeout}s"
    )
    call_id, is_progress, body = parse_frame(item[1])
    assert (call_id, is_progress) == (request.call_id, False)
    return CallOutcome.model_validate_json(body)


# -- celery inspect ------------------------------------------------------------------


def active_calls(producer: Celery, worker: WorkerProcess, *, safe: bool) -> list[dict[str, Any]]:
    """``celery inspect active`` of ``worker``: the calls it runs now."""
    assert worker.info is not None
    inspect = producer.control.inspect(timeout=2.0, destination=[worker.info.hostname], limit=1)
    replies = inspect.active(safe=safe) or {}
    return list(replies.get(worker.info.hostname, []))


def test_celery_inspect_lists_a_running_client_call_as_it_lists_a_send_task_call(
    events_worker: WorkerProcess, agent: ToolClient, producer: Celery, redis_client: redis.Redis
) -> None:
    request = stock_request("slow_report", {"seconds": SLOW_SECONDS}, timeout=30.0)
    slow_report = remote_tool("slow_report")
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        client_call = pool.submit(slow_report.invoke_sync, {"seconds": SLOW_SECONDS}, timeout=30.0)
        send_like_the_client(producer, request, task_name=TASK_AT_MOST_ONCE, queue="default")

        def both(safe: bool) -> tuple[dict[str, Any], dict[str, Any]] | None:
            entries = active_calls(producer, events_worker, safe=safe)
            if safe:  # the reprs carry no client id: tell the two apart by task id
                mine = [e for e in entries if str(e["id"]).startswith(agent.client_id)]
            else:
                mine = [e for e in entries if e["kwargs"].get("reply_to") == agent.client_id]
            theirs = [e for e in entries if e["id"] == request.call_id]
            return (mine[0], theirs[0]) if mine and theirs else None

        assert wait_until(lambda: both(safe=False) is not None, timeout=10.0), (
            "inspect never listed both calls"
        )
        listed = both(safe=False)
        listed_safe = both(safe=True)
        result = client_call.result(timeout=30.0)

    assert listed is not None and listed_safe is not None, (
        "a call finished before inspect saw it again"
    )
    client, stock = listed
    assert client.keys() == stock.keys()
    # `type` is the task; `name` is the same today, and the shadow header's if one is set.
    assert client["type"] == stock["type"] == TASK_AT_MOST_ONCE
    assert client["name"] == stock["name"]
    assert client["id"] == client["kwargs"]["call_id"] and stock["id"] == request.call_id
    assert client["kwargs"].keys() == stock["kwargs"].keys()
    assert client["kwargs"]["tool"] == stock["kwargs"]["tool"] == "slow_report"
    assert (
        client["kwargs"]["arguments"] == stock["kwargs"]["arguments"] == {"seconds": SLOW_SECONDS}
    )
    for field in ("args", "hostname", "acknowledged", "delivery_info"):
        assert client[field] == stock[field], field
    assert type(client["time_start"]) is type(stock["time_start"])
    assert type(client["worker_pid"]) is type(stock["worker_pid"])
    # `inspect active --safe` shows the reprs: the tool's name, no arguments.
    client_safe, stock_safe = listed_safe
    assert client_safe.keys() == stock_safe.keys()
    assert client_safe["id"] == client["id"]
    assert (client_safe["args"], client_safe["kwargs"]) == ("()", kwargsrepr_of("slow_report"))
    assert (stock_safe["args"], stock_safe["kwargs"]) == ("()", kwargsrepr_of("slow_report"))
    # Both ran to the end.
    assert result["slept"] == SLOW_SECONDS
    outcome = stock_outcome(redis_client, request)
    assert outcome.ok and outcome.result["slept"] == SLOW_SECONDS


# -- Flower --------------------------------------------------------------------------


def flower_get(base: str, path: str) -> Any:
    """GET ``path`` from Flower's API as JSON; None if Flower does not answer or knows nothing."""
    try:
        with urllib.request.urlopen(base + path, timeout=2.0) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def subscribed(redis_client: redis.Redis, pid: int | None) -> bool:
    """Whether a connection of process ``pid`` to ``redis_client``'s server holds a pattern
    subscription (kombu's fanout: Flower's event receiver)."""
    if pid is None:
        return False
    try:
        ports = {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")}
    except psutil.Error:
        return False
    return any(
        int(client.get("psub", 0)) > 0 and int(str(client["addr"]).rsplit(":", 1)[1]) in ports
        for client in redis_client.client_list()
    )


@pytest.fixture
def flower(
    events_worker: WorkerProcess,
    contract_env: dict[str, str],
    redis_client: redis.Redis,
    tmp_path: Path,
) -> Iterator[str]:
    """``celery -A executor flower`` on a free port, listening for events; its base URL."""
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
    env = {**os.environ, **contract_env, "FLOWER_UNAUTHENTICATED_API": "true"}
    with ChildProcess("flower", argv, env=env, cwd=PROJECT_ROOT, log_dir=tmp_path) as process:
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            # Up when the API answers and its event receiver has subscribed (a pattern
            # subscription on one of Flower's own connections): events published before
            # that are lost to it. Not a count of all pattern subscriptions: a worker
            # just started subscribes its control queue about then too.
            if not process.is_running:
                return True
            return flower_get(base, "/api/tasks") is not None and subscribed(
                redis_client, process.pid
            )

        wait_until(ready, timeout=30.0)
        assert process.is_running, f"flower exited:\n{process.log_tail()}"
        assert ready(), f"flower did not get ready within 30s:\n{process.log_tail()}"
        yield base


def test_flower_shows_a_client_call_as_it_shows_a_send_task_call(
    flower: str, agent: ToolClient, producer: Celery, redis_client: redis.Redis
) -> None:
    # The client's own send path (prepare, publish, wait), with the call's id in hand.
    request = stock_request("search", {"query": "fox"}, timeout=30.0)
    send_like_the_client(producer, request, task_name=TASK_AT_MOST_ONCE, queue="default")
    with sent_calls() as sent:
        result = remote_tool("search", client=agent).invoke_sync({"query": "fox"}, timeout=30.0)
    assert result, result
    (call,) = sent
    client_id = call.call_id
    assert stock_outcome(redis_client, request).ok

    def finished(task_id: str) -> dict[str, Any] | None:
        task = flower_get(flower, f"/api/task/info/{task_id}")
        return task if task is not None and task.get("state") == "SUCCESS" else None

    seen = wait_until(lambda: finished(client_id) and finished(request.call_id), timeout=15.0)
    tasks = flower_get(flower, "/api/tasks") or {}
    assert seen, f"Flower lists {sorted(tasks)}, not both {client_id} and {request.call_id}"
    client, stock = finished(client_id), finished(request.call_id)
    assert client is not None and stock is not None
    assert client_id in tasks and request.call_id in tasks

    assert client.keys() == stock.keys()
    shown = {key for key, value in client.items() if value is not None}
    assert shown == {key for key, value in stock.items() if value is not None}
    assert {"received", "started", "succeeded", "expires"} <= shown
    assert client["uuid"] == client_id and stock["uuid"] == request.call_id
    # Today both show the task's name; a shadow header may make it the tool's (then for both).
    for field in ("name", "state", "args", "kwargs", "worker", "retries", "result", "eta"):
        assert client[field] == stock[field], field
    assert (client["args"], client["kwargs"]) == ("()", kwargsrepr_of("search"))
    assert client["root_id"] == client_id and client["parent_id"] is None
