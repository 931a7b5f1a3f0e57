"""The client's watchdog answers a waiting idempotent call from its key's stored state.

Whoever waits on a key (its claimant, not only a caller that joined it) is answered
once the key's state holds a stored outcome (``done:<outcome>``), even when no frame
comes: the watchdog reads the state with the holder on every round. Here the claimant's
message waits in a queue no worker consumes any more, and the outcome is stored under
its key as another delivery would have stored it.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from agent_client import ToolClient, remote_tool
from agent_client.runs import idempotency_key
from toolexec import RedisServer, WorkerProcess
from wire import keys
from wire.formats import stored_state
from wire.models import CallOutcome
from wire.settings import Settings

from .conftest import PROJECT_ROOT
from .polling import wait_until

pytestmark = pytest.mark.integration

INTERVAL = 1.0


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("watched-redis")) as server:
        yield server


@pytest.fixture
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "TOOLEXEC_BROKER_URL": server.url,
        "TOOLEXEC_REDIS_URL": server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("watched-data")),
        "TOOLEXEC_HEARTBEAT_INTERVAL": str(INTERVAL),
        "TOOLEXEC_TOOL_MODULES": "tests.integration.count_tools",
    }


def test_a_claimant_whose_frame_never_comes_is_answered_from_the_stored_state(
    env: dict[str, str], server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    worker = WorkerProcess(
        name=f"watched-{uuid.uuid4().hex[:8]}",
        pool="solo",
        concurrency=1,
        queues=("counted",),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("watched-worker"),
    )
    client = ToolClient(Settings.from_env(env))
    try:
        with worker:  # publishes the tool; then nobody consumes its queue
            keyed = remote_tool("counted_noop_idempotent", client=client)
        run_id = uuid.uuid4().hex
        key = idempotency_key(run_id, keyed.name, keyed.parameters, {"key": 1})
        with (
            redis.Redis.from_url(server.url) as store,
            concurrent.futures.ThreadPoolExecutor(1) as pool,
        ):
            pending = pool.submit(keyed.invoke_sync, {"key": 1}, run_id=run_id, timeout=30)
            assert wait_until(lambda: store.exists(keys.claim(key))), (
                "the call never claimed its key"
            )
            stored = CallOutcome.success("another-delivery", 41)
            store.set(keys.state(key), stored_state(stored.model_dump_json()), px=60_000)
            stored_at = time.monotonic()
            result = pending.result(timeout=30)
            waited = time.monotonic() - stored_at
            queued = store.llen("counted")
    finally:
        client.close()

    assert result == 41
    assert queued == 1, "the message was taken: a worker ran the call"
    # Watched after one interval, answered at the next round: a few intervals at most.
    assert waited < 4 * INTERVAL, f"answered {waited:.1f}s after the outcome was stored"
