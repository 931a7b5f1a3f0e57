"""A worker started with ``TOOLEXEC_METRICS_PORT`` serves its Prometheus metrics at /metrics.

A prefork worker (two pool children, so the values of several processes are merged)
serves the ``observe`` queue; the test makes calls that succeed, fail, are shed as
expired and pass their hard limit, and reads the counters, the latency histogram and
the running-calls gauge per tool from a scrape.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from agent_client import ToolClient, ToolExecutionError, WorkerLost, remote_tool
from toolexec import WorkerProcess, free_port
from wire.clock import shared_now
from wire.message import redis_envelope, task_headers
from wire.models import TASK_AT_MOST_ONCE, CallRequest

from .polling import wait_until
from .workers import module_worker

pytestmark = pytest.mark.integration


#: (metric sample name, labels) -> value.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def metrics_port() -> int:
    """The port the worker serves its metrics on."""
    return free_port()


@pytest.fixture(scope="module")
def metrics_worker(
    probe_env: dict[str, str], metrics_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A prefork worker with two children and metrics on, the only consumer of ``observe``."""
    env = {
        **probe_env,
        "TOOLEXEC_TOOL_MODULES": "tests.integration.observe_tools",
        "TOOLEXEC_METRICS_PORT": str(metrics_port),
    }
    with module_worker(tmp_path_factory, "metrics", env=env, queues=("observe",)) as worker:
        yield worker


def scrape(port: int) -> Samples | None:
    """Every sample at ``http://127.0.0.1:port/metrics``; None if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; 0 when it is absent."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def send_expired(client: redis.Redis, tool: str) -> None:
    """Put a call of ``tool`` whose deadline has passed on its queue, as the client writes it."""
    call = CallRequest(
        call_id=uuid.uuid4().hex,
        tool=tool,
        arguments={"text": "late"},
        reply_to=f"metrics-nobody-{uuid.uuid4().hex[:8]}",
        deadline=shared_now() - 1,
    )
    headers = task_headers(call, task_name=TASK_AT_MOST_ONCE)
    client.lpush("observe", redis_envelope(call, queue="observe", headers=headers))


def test_metrics_count_calls_errors_sheds_and_hard_timeouts_per_tool_with_latency_and_running(
    metrics_worker: WorkerProcess,
    metrics_port: int,
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    assert wait_until(lambda: scrape(metrics_port) is not None, timeout=10.0), (
        metrics_worker.log_tail()
    )
    echo, fail, hard = (
        remote_tool(name, timeout=10) for name in ("observe_echo", "observe_fail", "observe_hard")
    )

    for text in ("a", "b", "c"):
        assert echo.invoke_sync({"text": text}) == text
    for text in ("x", "y"):
        with pytest.raises(ToolExecutionError):
            fail.invoke_sync({"text": text})
    with pytest.raises(ToolExecutionError, match="ToolHardTimeout"):
        hard.invoke_sync({"seconds": 3.0})
    send_expired(redis_client, "observe_echo")

    def shed() -> Samples | None:
        samples = scrape(metrics_port)
        return (
            samples
            if samples and value(samples, "toolexec_sheds_total", tool="observe_echo")
            else None
        )

    assert wait_until(lambda: shed() is not None, timeout=10.0)
    samples = shed()
    assert samples is not None
    assert value(samples, "toolexec_calls_total", tool="observe_echo") == 4  # 3 ran, 1 shed
    assert value(samples, "toolexec_calls_total", tool="observe_fail") == 2
    assert value(samples, "toolexec_calls_total", tool="observe_hard") == 1
    assert value(samples, "toolexec_errors_total", tool="observe_fail", kind="execution") == 2
    assert value(samples, "toolexec_errors_total", tool="observe_echo", kind="expired") == 1
    assert value(samples, "toolexec_errors_total", tool="observe_hard", kind="hard_timeout") == 1
    assert value(samples, "toolexec_errors_total", tool="observe_echo", kind="execution") == 0
    assert value(samples, "toolexec_sheds_total", tool="observe_echo") == 1
    assert value(samples, "toolexec_hard_timeouts_total", tool="observe_hard") == 1
    assert value(samples, "toolexec_hard_timeouts_total", tool="observe_echo") == 0
    # The histogram times the runs: the shed call never ran.
    assert value(samples, "toolexec_call_duration_seconds_count", tool="observe_echo") == 3
    assert value(samples, "toolexec_call_duration_seconds_count", tool="observe_fail") == 2
    assert value(samples, "toolexec_call_duration_seconds_count", tool="observe_hard") == 1
    assert value(samples, "toolexec_call_duration_seconds_sum", tool="observe_hard") >= 0.5
    assert (
        value(samples, "toolexec_call_duration_seconds_bucket", tool="observe_hard", le="0.25") == 0
    )
    assert (
        value(samples, "toolexec_call_duration_seconds_bucket", tool="observe_hard", le="1.0") == 1
    )
    assert value(samples, "toolexec_calls_running", tool="observe_hard") == 0


def test_the_running_gauge_counts_a_call_while_it_runs_and_drops_it_after(
    metrics_worker: WorkerProcess,
    metrics_port: int,
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    marker = f"observe:block:{uuid.uuid4().hex}"
    block = remote_tool("observe_block", timeout=15)

    def running() -> float:
        samples = scrape(metrics_port) or {}
        return value(samples, "toolexec_calls_running", tool="observe_block")

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        call = pool.submit(block.invoke_sync, {"seconds": 1.5, "marker": marker})
        assert wait_until(lambda: redis_client.exists(marker), timeout=10.0)
        during = running()
        result = call.result(timeout=15)

    assert result == {"slept": 1.5}
    assert during == 1
    assert running() == 0


def test_the_running_call_of_a_pool_child_that_was_killed_is_no_longer_counted(
    metrics_worker: WorkerProcess,
    metrics_port: int,
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    marker = f"observe:block:{uuid.uuid4().hex}"
    block = remote_tool("observe_block", timeout=15)

    def samples() -> Samples:
        return scrape(metrics_port) or {}

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        call = pool.submit(block.invoke_sync, {"seconds": 10, "marker": marker})
        assert wait_until(lambda: redis_client.exists(marker), timeout=10.0)
        assert value(samples(), "toolexec_calls_running", tool="observe_block") == 1
        os.kill(int(redis_client.get(marker) or 0), signal.SIGKILL)
        with pytest.raises(WorkerLost):
            call.result(timeout=15)

    after = samples()
    assert value(after, "toolexec_calls_running", tool="observe_block") == 0
    assert value(after, "toolexec_errors_total", tool="observe_block", kind="worker_lost") == 1
