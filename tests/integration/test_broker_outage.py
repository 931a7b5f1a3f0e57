"""Redis going away and coming back, on a private server of the test's own.

The session's server stays untouched: this test stops and restarts its own server (on
the same port) under its own worker and its own client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent_client import BrokerUnavailable, RemoteToolError, ToolClient, remote_tool
from executor.launch import RedisServer
from executor.settings import Settings

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis server for this test alone."""
    with RedisServer(directory=tmp_path / "own-redis") as server:
        yield server


def test_redis_down_raises_broker_unavailable_at_once_and_calls_work_again_after_a_restart(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    probe_env: dict[str, str],
    tmp_path: Path,
) -> None:
    env = {
        **probe_env,
        "TOOLEXEC_BROKER_URL": own_server.url,
        "TOOLEXEC_REDIS_URL": own_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
    }
    worker_factory(pool="prefork", concurrency=1, env=env)
    client = ToolClient(Settings.from_env(env))
    try:
        echo = remote_tool("probe_echo", timeout=2, client=client)
        sleeper = remote_tool("probe_sleep", timeout=10, client=client)
        assert echo(text="before", number=1)["text"] == "before"

        # A call in flight when Redis goes away fails long before its 10 s deadline.
        async def in_flight_when_redis_stops() -> float:
            call = asyncio.ensure_future(sleeper.run(seconds=1))
            await asyncio.sleep(0.2)
            stopped = time.monotonic()
            own_server.stop()
            with pytest.raises(BrokerUnavailable):
                await call
            return time.monotonic() - stopped

        waited = asyncio.run(in_flight_when_redis_stops())
        assert waited < 3.0, f"the waiting caller heard after {waited:.2f}s"

        # A new call with Redis down fails at once, sync and async.
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            echo(text="while down", number=2)
        elapsed = time.monotonic() - started
        assert elapsed < 0.5, f"took {elapsed:.2f}s of a 2 s deadline"
        assert "Redis" in str(raised.value) or "probe_echo" in str(raised.value)

        async def async_call_while_down() -> float:
            started = time.monotonic()
            with pytest.raises(BrokerUnavailable):
                await echo.run(text="while down", number=3)
            return time.monotonic() - started

        assert asyncio.run(async_call_while_down()) < 0.5

        # Back on the same port: once the worker reconnects and beats, calls work again.
        own_server.start()
        recovered = time.monotonic()
        result: Any = None
        while result is None:
            try:
                result = remote_tool("probe_echo", timeout=2, client=client)(text="after", number=4)
            except RemoteToolError as exc:
                assert time.monotonic() - recovered < 30, f"still failing after 30 s: {exc!r}"
                time.sleep(0.2)
        assert result["text"] == "after"
    finally:
        client.close()
