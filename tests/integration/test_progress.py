"""A tool's progress reaches its caller: throttled, in order, before the outcome, never after.

Each test runs once per pool against one worker that alone serves the ``observe`` queue
(``tests/integration/observe_tools.py``); pytest groups the tests by pool and stops one
pool's worker before it starts the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from agent_client import (
    ProgressEvent,
    ToolClient,
    ToolExecutionError,
    ToolResult,
    ToolTimeoutError,
    remote_tool,
)
from executor.context import MIN_INTERVAL
from tests.redis_stats import calls_of
from toolexec import Pool, WorkerProcess
from wire import keys

from .polling import wait_until
from .workers import module_worker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["prefork", "threads", "solo", "asyncio"])
def observe_worker(
    request: pytest.FixtureRequest,
    probe_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """One worker of the given pool, the only consumer of ``observe``."""
    pool: Pool = request.param
    env = {**probe_env, "TOOLEXEC_TOOL_MODULES": "tests.integration.observe_tools"}
    with module_worker(
        tmp_path_factory, f"observe-{pool}", env=env, pool=pool, queues=("observe",)
    ) as worker:
        yield worker


def rpush_calls(client: redis.Redis) -> int:
    """How many RPUSH commands the server has run (progress and outcome frames are RPUSHes)."""
    return calls_of(client, "rpush")


def most_frames(seconds: float) -> int:
    """The most progress frames a call that ran ``seconds`` may send: one per interval,
    plus the last."""
    return int(seconds / MIN_INTERVAL) + 2


@pytest.mark.parametrize("name", ["observe_steps", "observe_steps_async"])
def test_a_hot_loop_of_reports_sends_few_frames_and_the_caller_sees_the_last_step(
    observe_worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis, name: str
) -> None:
    steps = 20_000
    events: list[ProgressEvent] = []
    before = rpush_calls(redis_client)
    started = time.monotonic()

    result = remote_tool(name, timeout=30).invoke_sync({"steps": steps}, on_progress=events.append)

    elapsed = time.monotonic() - started
    pushed = rpush_calls(redis_client) - before
    assert result == {"steps": steps}
    assert events[-1] == ProgressEvent(steps, steps, f"step {steps}")
    assert 1 <= len(events) <= most_frames(elapsed)
    # Every RPUSH is a frame of this call: its progress frames, then its outcome.
    assert pushed <= most_frames(elapsed) + 1
    assert len(events) <= pushed - 1


@pytest.mark.parametrize("name", ["observe_steps", "observe_steps_async"])
def test_a_paced_tools_progress_arrives_while_it_runs_in_order_ending_with_its_last_step(
    observe_worker: WorkerProcess, tool_client: ToolClient, name: str
) -> None:
    steps, pause = 40, 0.02
    seen: list[tuple[float, ProgressEvent]] = []

    async def call() -> tuple[float, object]:
        result = await remote_tool(name, timeout=30).invoke(
            {"steps": steps, "pause": pause},
            on_progress=lambda event: seen.append((time.monotonic(), event)),
        )
        return time.monotonic(), result

    returned_at, result = asyncio.run(call())

    assert result == {"steps": steps}
    done = [event.done for _, event in seen]
    assert done == sorted(set(done)), "progress went backwards or repeated"
    assert done[-1] == steps and seen[-1][1].fraction == 1.0
    # The run takes 0.8 s: reports arrived while it ran, about one per interval.
    assert 3 <= len(seen) <= most_frames(steps * pause * 2)
    assert seen[0][0] < returned_at - 0.3, "the first report came only with the outcome"


def test_stream_yields_progress_events_then_the_result(
    observe_worker: WorkerProcess, tool_client: ToolClient
) -> None:
    async def collect() -> list[ProgressEvent | ToolResult]:
        tool = remote_tool("observe_steps", timeout=30)
        return [event async for event in tool.stream(steps=10, pause=0.03)]

    events = asyncio.run(collect())

    *progress, last = events
    assert last == ToolResult({"steps": 10})
    assert progress and all(isinstance(event, ProgressEvent) for event in progress)
    done = [event.done for event in progress if isinstance(event, ProgressEvent)]
    assert done == sorted(set(done)) and done[-1] == 10


def test_stream_of_a_failing_tool_yields_its_progress_then_raises_its_error(
    observe_worker: WorkerProcess, tool_client: ToolClient
) -> None:
    seen: list[ProgressEvent | ToolResult] = []

    async def collect() -> None:
        tool = remote_tool("observe_steps_then_fail", timeout=30)
        async for event in tool.stream(steps=5, pause=0.03):
            seen.append(event)

    with pytest.raises(ToolExecutionError, match="failed after 5 steps") as raised:
        asyncio.run(collect())

    assert raised.value.remote_type == "ValueError"
    assert seen and seen[-1] == ProgressEvent(5, 5, None)
    assert all(isinstance(event, ProgressEvent) for event in seen)


def test_a_caller_that_gave_up_gets_no_progress_after_its_timeout_and_no_error(
    observe_worker: WorkerProcess,
    tool_client: ToolClient,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_client")
    marker = f"observe:done:{uuid.uuid4().hex}"
    events: list[ProgressEvent] = []

    with pytest.raises(ToolTimeoutError):
        remote_tool("observe_steps", timeout=0.5).invoke_sync(
            {"steps": 15, "pause": 0.1, "marker": marker}, on_progress=events.append
        )
    at_timeout = list(events)

    # The tool runs on, reporting, and delivers its outcome to a caller who has left.
    assert wait_until(lambda: redis_client.exists(marker), timeout=15.0)
    reply_list = keys.reply(tool_client.client_id)
    assert wait_until(lambda: redis_client.llen(reply_list) == 0, timeout=10.0)
    # The listener is alive and well: the next call with progress works.
    after = remote_tool("observe_steps", timeout=30).invoke_sync(
        {"steps": 3}, on_progress=events.append
    )

    assert after == {"steps": 3}
    assert at_timeout and all(event.total == 15 for event in at_timeout)
    assert events[: len(at_timeout)] == at_timeout
    assert [event.total for event in events[len(at_timeout) :]] == [3] * (
        len(events) - len(at_timeout)
    )
    assert events[-1] == ProgressEvent(3, 3, "step 3")
    assert [r.getMessage() for r in caplog.records] == []


def test_a_callback_that_raises_is_logged_and_the_call_goes_on(
    observe_worker: WorkerProcess, tool_client: ToolClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agent_client.progress")

    def broken(event: ProgressEvent) -> None:
        raise RuntimeError(f"broken at {event.done}")

    result = remote_tool("observe_steps", timeout=30).invoke_sync({"steps": 3}, on_progress=broken)

    assert result == {"steps": 3}
    assert any("progress callback raised RuntimeError" in r.getMessage() for r in caplog.records)
