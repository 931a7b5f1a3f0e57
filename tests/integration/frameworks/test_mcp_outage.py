"""``toolexec mcp`` with its Redis frozen or slow: the loop keeps serving, deadlines hold.

The server, its workers and its Redis are each test's own: a private ``redis-server``
that a test stops with ``SIGSTOP`` (it answers nothing and closes nothing), by its
PID, and starts again with ``SIGCONT``; or that the server reaches through a
:class:`~tests.integration.broker_support.TcpProxy` whose ``latency`` holds every reply
back (slow, but answering). The client is mcp's own ``ClientSession`` over stdio. A
Redis read that blocked the server's loop (the catalog watcher reads every heartbeat
interval, 1 s here, for up to 2 s) would hold every request behind it; a catalog read
that a call's deadline did not count would let the call run past it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from agent_client import ToolClient
from toolexec import RedisServer
from toolexec.mcp import TIMEOUT_META_KEY
from wire.settings import Settings

from ..broker_support import TcpProxy
from ..conftest import PROBE_TOOL_MODULES, WorkerFactory
from .test_mcp import StdioServer, meta, text

pytestmark = pytest.mark.integration

#: How long Redis stays frozen while the loop is watched: several watcher reads.
FROZEN_FOR = 3.5
#: The slowest a ping may answer while Redis is frozen (a blocked loop takes 2 s).
PROMPT = 0.75
#: How late past its deadline a call's error may come back (a loaded machine).
SLACK = 0.75

#: How late each reply of the slow Redis comes: a catalog read (two round trips) takes
#: twice this, half of :data:`SLOW_DEADLINE`, and a send is still confirmed within it.
LATENCY = 0.6
#: The deadline of the call that must first read the catalog.
SLOW_DEADLINE = 2.4
#: The tool that is not in the server's view: its worker starts after the server read it.
LATE_TOOL = "late_sleep"


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own, never left stopped."""
    with RedisServer(directory=tmp_path / "own-redis") as server:
        yield server
        _signal(server, signal.SIGCONT)


@pytest.fixture
def server(
    own_server: RedisServer,
    settings_env: dict[str, str],
    worker_factory: WorkerFactory,
    tmp_path: Path,
) -> Iterator[StdioServer]:
    """``toolexec mcp`` over stdio and one worker with the probe tools, both on the own Redis."""
    env = {
        **settings_env,
        "TOOLEXEC_BROKER_URL": own_server.url,
        "TOOLEXEC_REDIS_URL": own_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
        "TOOLEXEC_TOOL_MODULES": PROBE_TOOL_MODULES,
    }
    worker_factory(env=env)
    with open(tmp_path / "mcp-stdio.log", "w") as errlog:
        yield StdioServer(env, errlog)


@pytest.fixture
def slow_redis(own_server: RedisServer) -> Iterator[TcpProxy]:
    """The way to the own Redis, for the server: its ``latency`` makes Redis slow."""
    proxy = TcpProxy(own_server.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def server_via_slow_redis(
    own_server: RedisServer,
    slow_redis: TcpProxy,
    settings_env: dict[str, str],
    worker_factory: WorkerFactory,
    tmp_path: Path,
) -> Iterator[StdioServer]:
    """``toolexec mcp`` over stdio reaching the own Redis through :func:`slow_redis`.

    A worker with the probe tools is up first. The server's heartbeat interval is a
    minute, so its catalog watcher reads once, when it starts, and then not during the
    test: the view changes only when the test's own requests read it.
    """
    env = {
        **settings_env,
        "TOOLEXEC_BROKER_URL": own_server.url,
        "TOOLEXEC_REDIS_URL": own_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
        "TOOLEXEC_TOOL_MODULES": PROBE_TOOL_MODULES,
    }
    worker_factory(env=env)
    proxied = f"redis://127.0.0.1:{slow_redis.port}/0"
    server_env = {
        **env,
        "TOOLEXEC_BROKER_URL": proxied,
        "TOOLEXEC_REDIS_URL": proxied,
        "TOOLEXEC_HEARTBEAT_INTERVAL": "60",
    }
    with open(tmp_path / "mcp-stdio.log", "w") as errlog:
        yield StdioServer(server_env, errlog)


def _signal(server: RedisServer, sig: signal.Signals) -> None:
    if server.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, sig)


async def _timed(work: Any) -> tuple[Any, float]:
    started = time.monotonic()
    try:
        result = await work
    except MCPError as exc:
        result = exc
    return result, time.monotonic() - started


def test_with_redis_frozen_pings_answer_at_once_and_calls_fail_within_their_deadlines(
    own_server: RedisServer, server: StdioServer
) -> None:
    echo = {"text": "hi", "number": 1}
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        assert "probe_echo" in {tool.name for tool in (await session.list_tools()).tools}
        assert not (await session.call_tool("probe_echo", echo)).is_error  # connections made
        pings: list[float] = []
        _signal(own_server, signal.SIGSTOP)
        try:
            async with anyio.create_task_group() as tasks:

                async def measure(name: str, work: Any) -> None:
                    seen[name] = await _timed(work)

                tasks.start_soon(measure, "listed", session.list_tools())
                for name, tool in (("known", "probe_echo"), ("unknown", "no_such_tool")):
                    half_second = meta({TIMEOUT_META_KEY: 0.5})
                    tasks.start_soon(measure, name, session.call_tool(tool, echo, meta=half_second))
                ends = time.monotonic() + FROZEN_FOR
                while time.monotonic() < ends:
                    _, took = await _timed(session.send_ping())
                    pings.append(took)
                    await anyio.sleep(0.05)
        finally:
            _signal(own_server, signal.SIGCONT)
        seen["pings"] = pings
        with anyio.fail_after(30):
            while (await session.call_tool("probe_echo", echo)).is_error:  # Redis is back
                await anyio.sleep(0.2)

    server.run(body)

    pings = seen["pings"]
    assert len(pings) > 10 and max(pings) < PROMPT, pings
    for name in ("known", "unknown"):
        result, took = seen[name]
        assert isinstance(result, types.CallToolResult) and result.is_error, (name, result)
        assert 0.5 <= took < 0.5 + SLACK, (name, took, text(result))
    # Not a ToolNotFound: the catalog could not be read within the call's deadline.
    assert text(seen["unknown"][0]) == (
        "cannot send the call to 'no_such_tool': the tool catalog could not be read from Redis "
        "within its 0.5s deadline; the call was not sent"
    )
    listed, took = seen["listed"]
    if isinstance(listed, types.ListToolsResult):  # the view was still fresh: no read
        assert "probe_echo" in {tool.name for tool in listed.tools}
    else:  # read, and Redis did not answer: there is no list to give
        assert isinstance(listed, MCPError) and "Redis" in str(listed), listed
    assert took < 2.0 + SLACK  # at most the catalog's bounded read


def test_with_redis_slow_a_call_that_must_read_the_catalog_first_times_out_at_its_deadline(
    own_server: RedisServer,
    slow_redis: TcpProxy,
    server_via_slow_redis: StdioServer,
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    tmp_path: Path,
) -> None:
    late_env = {
        **settings_env,
        "TOOLEXEC_BROKER_URL": own_server.url,
        "TOOLEXEC_REDIS_URL": own_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
        "TOOLEXEC_TOOL_MODULES": "tests.integration.frameworks.late_tools",
    }
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert "probe_echo" in listed and LATE_TOOL not in listed  # the view, read without it
        # Connects the server's send and reply links while Redis is fast.
        assert not (await session.call_tool("probe_echo", {"text": "hi", "number": 1})).is_error
        await anyio.to_thread.run_sync(lambda: worker_factory(queues=("late",), env=late_env))
        slow_redis.latency = LATENCY
        try:
            seen["late"] = await _timed(
                session.call_tool(
                    LATE_TOOL, {"seconds": 5}, meta=meta({TIMEOUT_META_KEY: SLOW_DEADLINE})
                )
            )
        finally:
            slow_redis.latency = 0.0

    server_via_slow_redis.run(body)

    result, took = seen["late"]
    assert isinstance(result, types.CallToolResult) and result.is_error, result
    assert text(result) == f"tool {LATE_TOOL!r} timed out after {SLOW_DEADLINE:g}s"
    assert SLOW_DEADLINE <= took < SLOW_DEADLINE + SLACK, took
    # What the catalog read took on the way: had the deadline started after it, the call
    # would have come back that much later, past the bound above.
    read = _catalog_read_time(f"redis://127.0.0.1:{slow_redis.port}/0", slow_redis, settings_env)
    assert read > SLACK, read


def _catalog_read_time(url: str, proxy: TcpProxy, settings_env: dict[str, str]) -> float:
    """Seconds one catalog read takes through ``proxy`` at :data:`LATENCY` (connected first)."""
    client = ToolClient(
        Settings.from_env({**settings_env, "TOOLEXEC_REDIS_URL": url, "TOOLEXEC_BROKER_URL": url})
    )
    try:
        assert LATE_TOOL in client.catalog.available()  # connected, while Redis is fast
        proxy.latency = LATENCY
        client.catalog.invalidate()
        started = time.monotonic()
        assert LATE_TOOL in client.catalog.available()
        return time.monotonic() - started
    finally:
        proxy.latency = 0.0
        client.close()
