"""Worker-side retries (``@tool(retries=...)``) on every pool: prefork, solo, threads, asyncio.

Each test runs once per pool against one worker with metrics on, the only consumer of the
``retries`` queue (``tests/integration/retry_tools.py``). The worker is module-scoped per
pool: pytest groups the tests by pool and stops one pool's worker before it starts the
next. The tools count their runs in Redis under a key of each test's own, so the attempts
are counted whichever process made them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from agent_client import ToolClient, ToolExecutionError, remote_tool
from executor.stats import read_counts
from toolexec import Pool, WorkerProcess, free_port
from wire.clock import shared_now

from .polling import wait_until
from .test_metrics import scrape, value
from .workers import module_worker

pytestmark = pytest.mark.integration

QUEUE = "retries"
POOLS: list[Pool] = ["prefork", "solo", "threads", "asyncio"]


@pytest.fixture(scope="module", params=POOLS)
def retry_worker(
    request: pytest.FixtureRequest,
    probe_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """A worker of the given pool (two processes on prefork) with metrics on, serving
    ``retries``."""
    pool: Pool = request.param
    env = {
        **probe_env,
        "TOOLEXEC_TOOL_MODULES": "tests.integration.retry_tools",
        "TOOLEXEC_METRICS_PORT": str(free_port()),
    }
    with module_worker(
        tmp_path_factory, f"retries-{pool}", env=env, pool=pool, concurrency=2, queues=(QUEUE,)
    ) as worker:
        yield worker


def _key() -> str:
    return f"retries:runs:{uuid.uuid4().hex}"


@pytest.mark.parametrize("tool", ["retry_flaky", "retry_flaky_async"])
def test_a_tool_that_fails_twice_with_connection_error_then_succeeds_returns_its_result_after_three_attempts(  # noqa: E501
    retry_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis, tool: str
) -> None:
    key = _key()

    result = remote_tool(tool, timeout=10, wait=10).run_sync(key=key, failures=2)

    assert result == 3  # the third run's number: it returned
    assert int(redis_client.get(key) or 0) == 3


def test_an_exception_an_at_most_once_tool_does_not_list_is_answered_after_one_attempt(
    retry_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    key = _key()

    with pytest.raises(ToolExecutionError) as info:
        remote_tool("retry_wrong", timeout=10, wait=10).run_sync(key=key)

    assert (info.value.remote_type, info.value.attempts) == ("ValueError", 1)
    assert int(redis_client.get(key) or 0) == 1


def test_a_tool_whose_backoff_would_pass_the_deadline_stops_retrying_in_time(
    retry_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    # retry_down pauses 1-2 s after its first run, then 2-4 s: the second pause cannot end
    # within a 2.9 s deadline (1 + 2 > 2.9), so the worker answers after two runs of its six.
    key, timeout = _key(), 2.9
    down = remote_tool("retry_down", timeout=timeout, wait=10)
    started = time.monotonic()

    with pytest.raises(ToolExecutionError) as info:
        down.run_sync(key=key)

    elapsed = time.monotonic() - started
    assert (info.value.remote_type, info.value.attempts) == ("ConnectionError", 2)
    assert str(info.value).endswith("(after 2 attempts)")
    assert int(redis_client.get(key) or 0) == 2
    assert elapsed < timeout  # answered by the worker, not the caller's deadline


def test_attempts_under_a_hard_limit_may_outlast_one_hard_limit_and_celerys_margin(
    retry_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    # Three runs of 0.35 s and two pauses of at least 0.3 s and 0.6 s: more than the 0.45 s
    # hard limit plus Celery's 1 s margin, past which Celery's own limit would kill a
    # prefork process that had not been told of the retries (ToolSpec.longest_run).
    key = _key()

    result = remote_tool("retry_bounded", timeout=10, wait=10).run_sync(key=key)

    assert result == 3
    assert int(redis_client.get(key) or 0) == 3


def test_each_attempt_is_counted_in_the_metrics_and_each_retry_in_toolexec_status(
    retry_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    port = int(retry_worker.env["TOOLEXEC_METRICS_PORT"])
    assert wait_until(lambda: scrape(port) is not None)
    before = scrape(port) or {}

    def retries_counted() -> int:
        minute = read_counts(redis_client, shared_now())["last_minute"]
        return minute["retry_flaky"].retries if "retry_flaky" in minute else 0

    counted_before = retries_counted()

    assert remote_tool("retry_flaky", timeout=10, wait=10).run_sync(key=_key(), failures=2) == 3

    after = scrape(port) or {}
    for name, more in (("toolexec_attempts_total", 3), ("toolexec_retries_total", 2)):
        gained = value(after, name, tool="retry_flaky") - value(before, name, tool="retry_flaky")
        assert gained == more, name
    assert (
        value(after, "toolexec_calls_total", tool="retry_flaky")
        - value(before, "toolexec_calls_total", tool="retry_flaky")
        == 1
    )
    assert wait_until(lambda: retries_counted() >= counted_before + 2)
