"""Redis going away and coming back, on a private server of the test's own.

The session's server stays untouched: this test stops and restarts its own server (on
the same port) under its own worker and its own client.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from agent_client import (
    BrokerUnavailable,
    RemoteToolError,
    ToolClient,
    ToolTimeoutError,
    remote_tool,
)
from toolexec import RedisServer
from wire.settings import Settings

from .polling import wait_until, wait_until_async

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

#: How late past its deadline a caller may hear.
_SLACK = 0.1


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis server for this test alone."""
    with RedisServer(directory=tmp_path / "own-redis") as server:
        yield server


def test_redis_down_ends_each_call_at_its_deadline_with_what_it_knows_and_calls_work_again_after_a_restart(  # noqa: E501
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
    store = redis.Redis.from_url(own_server.url)
    try:
        echo = remote_tool("probe_echo", timeout=2, client=client)
        sleeper = remote_tool("probe_sleep", timeout=3, client=client)
        assert echo(text="before", number=1)["text"] == "before"

        # A call in flight when Redis goes away keeps waiting for its reply (the listener
        # re-attaches when Redis is back); only its deadline ends the wait. It was sent,
        # so it is a timeout, never "cannot send".
        marker = f"probetest:pid:{uuid.uuid4().hex}"

        async def in_flight_when_redis_stops() -> float:
            started = time.monotonic()
            call = asyncio.ensure_future(sleeper.run(seconds=1, marker=marker))
            # In flight: the worker has started it (the tool records its pid first).
            assert await wait_until_async(lambda: store.exists(marker)), "the call never started"
            assert not call.done()
            own_server.stop()
            with pytest.raises(ToolTimeoutError):
                await call
            return time.monotonic() - started

        waited = asyncio.run(in_flight_when_redis_stops())
        assert 3.0 <= waited < 3.0 + _SLACK, (
            f"the waiting caller heard after {waited:.2f}s of its 3 s"
        )

        # A new call with Redis down is sent again and again until its deadline, then
        # told it was not sent (so a retry is safe), sync and async.
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            echo(text="while down", number=2)
        elapsed = time.monotonic() - started
        assert 2.0 <= elapsed < 2.0 + _SLACK, f"took {elapsed:.2f}s of a 2 s deadline"
        assert "probe_echo" in str(raised.value) and "not sent" in str(raised.value)

        async def async_call_while_down() -> float:
            started = time.monotonic()
            with pytest.raises(BrokerUnavailable):
                await echo.run(text="while down", number=3)
            return time.monotonic() - started

        elapsed = asyncio.run(async_call_while_down())
        assert 2.0 <= elapsed < 2.0 + _SLACK, f"took {elapsed:.2f}s of a 2 s deadline"

        # Back on the same port: once the worker reconnects and beats, calls work again.
        own_server.start()
        results: list[Any] = []
        errors: list[RemoteToolError] = []

        def echo_works() -> bool:
            try:
                results.append(
                    remote_tool("probe_echo", timeout=2, client=client)(text="after", number=4)
                )
            except RemoteToolError as exc:
                errors.append(exc)
                return False
            return True

        assert wait_until(echo_works, timeout=30, interval=0.2), (
            f"still failing after 30 s: {errors[-1:]!r}"
        )
        assert results[0]["text"] == "after"
    finally:
        client.close()
        store.close()
