"""The catalog an agent reads: live workers' tools appear, a dead worker's drop out."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from agent_client import ToolClient, ToolNotFound, remote_tool, remote_tools
from toolexec import WorkerProcess
from wire.settings import Settings

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

STARTER_TOOLS = {"search", "get_today_date", "book_flight", "slow_report"}


def test_a_live_workers_tools_appear_in_remote_tools(
    probe_worker: WorkerProcess, tool_client: ToolClient
) -> None:
    assert probe_worker.info is not None
    served = set(probe_worker.info.tools)
    assert STARTER_TOOLS | {"probe_echo", "probe_sleep"} <= served

    toolset = remote_tools()
    assert served <= set(toolset.names)
    search = toolset["search"]
    assert search.parameters["required"] == ["query"]
    assert search.description.startswith("Search a small library")
    assert set(remote_tools(queues=["default"]).names) >= served
    assert "probe_slow_lane" not in toolset.names


def test_a_tool_on_the_slow_queue_is_served_only_by_a_worker_on_that_queue(
    probe_worker: WorkerProcess,
    tool_client: ToolClient,
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
) -> None:
    # The probe worker (queue "default") knows the tool and publishes its spec...
    assert probe_worker.info is not None
    assert "probe_slow_lane" not in probe_worker.info.tools
    # ...but does not serve it, so no agent can call it.
    with pytest.raises(ToolNotFound) as raised:
        remote_tool("probe_slow_lane")
    assert "'slow'" in str(raised.value)
    assert "probe_slow_lane" not in raised.value.available

    slow_worker = worker_factory(pool="solo", concurrency=1, queues=("slow",), env=probe_env)
    assert slow_worker.info is not None
    assert slow_worker.info.tools == ("probe_slow_lane",)

    lane = remote_tool("probe_slow_lane", timeout=10)
    assert lane.spec.queue == "slow"
    assert lane(text="via slow") == {
        "text": "via slow",
        "pid": slow_worker.pid,
    }  # solo: runs in-process
    assert "probe_slow_lane" in remote_tools(queues=["slow"]).names
    assert "probe_slow_lane" not in remote_tools(queues=["default"]).names


def test_a_killed_workers_tools_drop_out_within_about_one_heartbeat(
    tool_client: ToolClient,
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
    settings: Settings,
) -> None:
    slow_worker = worker_factory(pool="solo", concurrency=1, queues=("slow",), env=probe_env)
    assert "probe_slow_lane" in remote_tools().names

    slow_worker.kill()  # SIGKILL: no goodbye, the heartbeat just stops
    killed = time.monotonic()
    while "probe_slow_lane" in remote_tools().names:
        assert time.monotonic() - killed < 10, "the dead worker's tool never dropped out"
        time.sleep(0.02)
    elapsed = time.monotonic() - killed

    # The heartbeat key's TTL is one interval; the client's view is up to
    # min(1 s, interval / 2) old.
    cache_age = min(1.0, settings.heartbeat_interval / 2)
    assert elapsed <= settings.heartbeat_interval + cache_age + 0.3, f"took {elapsed:.2f}s"
    with pytest.raises(ToolNotFound) as raised:
        remote_tool("probe_slow_lane")
    assert raised.value.tool == "probe_slow_lane"
    assert "search" in raised.value.available
