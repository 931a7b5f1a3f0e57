"""No worker at this moment: calls wait for one within their deadline.

During a rolling restart a queue has no live worker for a while; an agent may start
before its workers. A call to a tool the catalog knows is sent anyway and waits in its
queue; ``remote_tool(name, wait=S)`` waits for a worker to serve the tool, and
``remote_tools(wait=S)`` for a worker to serve any. A name that
no worker ever published is still ``ToolNotFound`` at once.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import redis

from agent_client import ToolClient, ToolNotFound, remote_tool, remote_tools

from .polling import wait_until

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_redis(flush_redis: Callable[[], None], tool_client: ToolClient) -> None:
    """Redis emptied, and this module's client told so: its catalog view, cached for half
    a heartbeat interval, would still list what the last test's workers served."""
    tool_client.catalog.invalidate()


def test_a_call_to_a_known_tool_with_no_live_worker_waits_in_its_queue_for_one(
    tool_client: ToolClient,
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    first = worker_factory(pool="solo", concurrency=1, queues=("single",), env=probe_env)
    echo = remote_tool("probe_echo_single", timeout=10)
    assert echo(text="served", number=1)["text"] == "served"
    first.stop()  # the only worker of the queue: a rolling restart's gap begins
    assert wait_until(lambda: "probe_echo_single" not in remote_tools().names)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        call = pool.submit(echo, text="patient", number=2)
        # The call is sent anyway: it waits in the queue. Only then a worker starts.
        assert wait_until(lambda: redis_client.llen("single") == 1), "the call was not queued"
        assert not call.done()
        second = worker_factory(pool="solo", concurrency=1, queues=("single",), env=probe_env)
        result = call.result(timeout=15)
        waited = time.monotonic() - started

    assert result["text"] == "patient"
    assert result["pid"] == second.pid != first.pid  # solo: run by the new worker itself
    assert waited < 10


def test_remote_tool_waits_for_a_worker_when_the_agent_starts_before_its_workers(
    empty_redis: None,
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
) -> None:
    # An empty Redis: no worker ever published anything.
    with pytest.raises(ToolNotFound):
        remote_tool("probe_echo_single")
    worker = worker_factory(
        pool="solo", concurrency=1, queues=("single",), env=probe_env, wait=False
    )

    started = time.monotonic()
    echo = remote_tool("probe_echo_single", timeout=10, wait=30)
    waited = time.monotonic() - started

    assert worker.wait_ready(timeout=1).tools  # it is the worker that started meanwhile
    assert waited > 0.1, "the worker was ready at once: nothing was waited for"
    assert echo(text="late worker", number=3)["text"] == "late worker"


def test_remote_tools_waits_for_a_worker_when_the_agent_starts_before_its_workers(
    empty_redis: None,
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
) -> None:
    # An empty Redis: no worker serves anything, and without a wait the set is empty now.
    assert remote_tools(queues=["single"]).names == []
    worker = worker_factory(
        pool="solo", concurrency=1, queues=("single",), env=probe_env, wait=False
    )

    started = time.monotonic()
    tools = remote_tools(queues=["single"], wait=30, default_timeout=10)
    waited = time.monotonic() - started

    assert worker.wait_ready(timeout=1).tools  # it is the worker that started meanwhile
    assert waited > 0.1, "the worker was ready at once: nothing was waited for"
    assert "probe_echo_single" in tools.names
    assert tools["probe_echo_single"](text="late worker", number=4)["text"] == "late worker"
    # Nothing serves another queue: the set is empty once the wait is over.
    started = time.monotonic()
    assert remote_tools(queues=["no_such_queue"], wait=1.0).names == []
    assert 1.0 <= time.monotonic() - started < 1.5


def test_a_name_no_worker_ever_published_is_not_found_at_once_and_after_a_wait(
    tool_client: ToolClient,
) -> None:
    started = time.monotonic()
    with pytest.raises(ToolNotFound) as raised:
        remote_tool("no_such_tool_anywhere")
    assert time.monotonic() - started < 0.5
    assert "no worker has published it" in str(raised.value)

    started = time.monotonic()
    with pytest.raises(ToolNotFound):
        remote_tool("no_such_tool_anywhere", wait=1.0)
    assert 1.0 <= time.monotonic() - started < 1.5
