"""With Redis slow but answering, a call's deadline still counts from when it was made.

Redis is the session's own, reached by the client through a
:class:`~tests.integration.broker_support.TcpProxy` whose ``latency`` holds every reply
back (each round trip takes that much longer: a catalog read, two round trips, takes
twice it). The worker reaches Redis directly. A call whose catalog view is stale only
asks for a read in the background, so whatever framework adapter makes it (they all
go through ``RemoteTool.invoke`` or ``invoke_sync``), it never waits for the read;
``toolexec call`` reads the catalog before its call, and counts that read against the
call's deadline. (The MCP server's own case is in ``frameworks/test_mcp_outage.py``.)
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator

import pytest

from agent_client import ToolClient, ToolTimeoutError, remote_tool
from toolexec import RedisServer
from toolexec.commands.call import call_tool
from toolexec.commands.exits import CommandFailed, ExitCode
from wire.settings import Settings

from .broker_support import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("probe_worker")]

#: How late each reply of the slow Redis comes.
LATENCY = 0.6
#: The calls' deadline: a catalog read takes half of it, and a send is confirmed within it.
DEADLINE = 2.4
#: How late past its deadline a call may end on a loaded machine; less than a catalog read.
SLACK = 0.75


@pytest.fixture
def slow_redis(redis_server: RedisServer) -> Iterator[TcpProxy]:
    """The client's way to the session's Redis; its ``latency`` makes Redis slow."""
    proxy = TcpProxy(redis_server.port).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def slow_client(probe_env: dict[str, str], slow_redis: TcpProxy) -> Iterator[ToolClient]:
    """A client reaching Redis through :func:`slow_redis`, connected while Redis is fast."""
    url = f"redis://127.0.0.1:{slow_redis.port}/0"
    client = ToolClient(
        Settings.from_env({**probe_env, "TOOLEXEC_REDIS_URL": url, "TOOLEXEC_BROKER_URL": url})
    )
    echo = remote_tool("probe_echo", client=client)
    assert echo(text="hi", number=1)["text"] == "hi"  # connects the catalog, send and reply links
    yield client
    slow_redis.latency = 0.0
    client.close()


def _catalog_read_time(client: ToolClient, proxy: TcpProxy) -> float:
    """Seconds one catalog read takes now, through ``proxy``."""
    client.catalog.invalidate()
    started = time.monotonic()
    # wait= bounds this read by 10 s rather than the catalog's 2 s: two round trips of a
    # slow Redis on a loaded machine may take longer than that, and this only measures.
    assert "probe_sleep" in [spec.name for spec in client.catalog.specs(wait=10.0)]
    return time.monotonic() - started


@pytest.mark.parametrize("style", ["invoke", "invoke_sync"])
def test_with_redis_slow_a_proxy_call_on_a_stale_view_never_waits_for_the_catalog_read(
    slow_client: ToolClient, slow_redis: TcpProxy, style: str
) -> None:
    sleep = remote_tool("probe_sleep", client=slow_client)
    slow_client.catalog.invalidate()  # the call's look at the view asks for a read
    slow_redis.latency = LATENCY
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError) as raised:
        if style == "invoke":
            asyncio.run(sleep.invoke({"seconds": 5}, timeout=DEADLINE))
        else:
            sleep.invoke_sync({"seconds": 5}, timeout=DEADLINE)
    took = time.monotonic() - started

    assert raised.value.timeout == DEADLINE
    assert DEADLINE <= took < DEADLINE + SLACK, took
    # A read takes longer than the slack: a call that waited for one would be past it.
    assert _catalog_read_time(slow_client, slow_redis) > SLACK


def test_with_redis_slow_toolexec_call_counts_its_catalog_read_against_the_deadline(
    slow_client: ToolClient, slow_redis: TcpProxy
) -> None:
    slow_client.catalog.invalidate()  # remote_tool() reads the catalog before the call
    slow_redis.latency = LATENCY
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with pytest.raises(CommandFailed) as failed:
        call_tool(
            slow_client,
            "probe_sleep",
            ["seconds=5"],
            timeout=str(DEADLINE),
            run_id=None,
            as_json=False,
            stdin=io.StringIO(),
            out=out,
            err=err,
        )
    took = time.monotonic() - started

    assert failed.value.code is ExitCode.TIMEOUT
    assert (
        str(failed.value) == f"ToolTimeoutError: tool 'probe_sleep' timed out after {DEADLINE:g}s"
    )
    assert DEADLINE <= took < DEADLINE + SLACK, took
    assert _catalog_read_time(slow_client, slow_redis) > SLACK
