"""A Redis stall or restart never sheds a live caller's call (executor.callers).

The client's liveness key lapses while Redis cannot take its refresh (a pause longer than
an interval) and vanishes with a restart without persistence: workers must not take that
for the caller's death. Two workers of each pool, 400 calls of 100 ms with 8 s deadlines,
40 in flight (the operator's trial that found 4-7 calls shed per pause); the interval is
1 s, the pause three of them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_client import RemoteToolError, ToolClient, remote_tool
from tests.integration.conftest import WorkerFactory
from tests.integration.deploy_support import QUEUE, deploy_env
from toolexec import Pool, RedisServer
from wire.settings import Settings

pytestmark = pytest.mark.integration

CALLS, IN_FLIGHT, DEADLINE, PAUSE_MS = 400, 40, 8.0, 3000


@pytest.fixture
def forgetful_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own that keeps nothing across a restart (no persistence)."""
    with RedisServer(directory=tmp_path / "forgetful-redis") as server:
        yield server


def _load(client: ToolClient, fault: Callable[[], None]) -> list[Any]:
    """:data:`CALLS` calls, :data:`IN_FLIGHT` at once; ``fault`` runs in a thread once a
    third are done. Each call's result or the RemoteToolError it raised."""
    a_third = threading.Event()
    plain = remote_tool("deploy_plain", timeout=DEADLINE, client=client)

    async def load() -> list[Any]:
        gate = asyncio.Semaphore(IN_FLIGHT)
        done = 0

        async def one(i: int) -> Any:
            nonlocal done
            async with gate:
                try:
                    return await plain.invoke({"token": f"live-{i}", "seconds": 0.1})
                except RemoteToolError as exc:
                    return exc
                finally:
                    done += 1
                    if done == CALLS // 3:
                        a_third.set()

        return await asyncio.gather(*(one(i) for i in range(CALLS)))

    thread = threading.Thread(target=lambda: a_third.wait(120) and fault())
    thread.start()
    try:
        return asyncio.run(load())
    finally:
        a_third.set()
        thread.join(60)


def _failed(outcomes: list[Any]) -> list[str]:
    return [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, RemoteToolError)]


@pytest.mark.parametrize("pool", ["prefork", "threads", "asyncio", "solo"])
def test_a_redis_pause_of_three_intervals_sheds_no_call_of_a_live_caller(
    worker_factory: WorkerFactory,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    own_server: RedisServer,
    pool: Pool,
) -> None:
    for _ in range(2):
        worker_factory(pool=pool, concurrency=4, queues=(QUEUE,), env=fleet_env)
    paused: list[float] = []

    def pause() -> None:
        with redis.Redis.from_url(own_server.url) as admin:
            admin.execute_command("CLIENT", "PAUSE", PAUSE_MS)
        paused.append(time.monotonic())

    outcomes = _load(fleet_client, pause)
    assert paused, "Redis was not paused mid-run"
    assert _failed(outcomes) == []
    assert sorted(o["token"] for o in outcomes) == sorted(f"live-{i}" for i in range(CALLS))


def test_a_redis_restart_that_forgets_everything_sheds_no_call_of_a_live_caller(
    worker_factory: WorkerFactory, forgetful_server: RedisServer, tmp_path: Path
) -> None:
    env = deploy_env(forgetful_server, tmp_path / "data")
    for _ in range(2):
        worker_factory(pool="prefork", concurrency=4, queues=(QUEUE,), env=env)
    client = ToolClient(Settings.from_env(env))
    restarted: list[float] = []

    def restart() -> None:
        forgetful_server.kill()  # the liveness keys, the calls queued: all gone
        forgetful_server.start()
        restarted.append(time.monotonic())

    try:
        outcomes = _load(client, restart)
    finally:
        client.close()
    assert restarted, "Redis was not restarted mid-run"
    # A restart without persistence loses what Redis held: the calls queued and their
    # replies. Their callers hear ToolOutcomeUnknown (or their result, sent again); none
    # hears that it was shed, nor a timeout of a call that could still run.
    kinds = {type(o).__name__ for o in outcomes if isinstance(o, RemoteToolError)}
    assert kinds <= {"ToolOutcomeUnknown"}, _failed(outcomes)


def test_a_client_closed_and_used_again_at_once_has_none_of_its_calls_shed(
    worker_factory: WorkerFactory, fleet_env: dict[str, str], fleet_client: ToolClient
) -> None:
    # close() tells the workers its queued calls may be shed; the same client used again
    # (its next call starts it again) waits for its calls like any live caller.
    worker_factory(pool="prefork", concurrency=2, queues=(QUEUE,), env=fleet_env)
    plain = remote_tool("deploy_plain", timeout=DEADLINE, client=fleet_client)
    outcomes = []
    for i in range(8):
        try:
            outcomes.append(plain.invoke_sync({"token": f"again-{i}", "seconds": 0.0})["token"])
        except RemoteToolError as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
        fleet_client.close()
    assert outcomes == [f"again-{i}" for i in range(8)]
