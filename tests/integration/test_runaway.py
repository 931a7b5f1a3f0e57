"""Runaway tools: what a hard limit stops on each pool.

On prefork, a sync tool that spins past its ``hard_timeout`` gets its caller a
``ToolHardTimeout`` at once; then the pool process running it leaves (after the reply is
delivered), billiard starts a fresh one, and the call is never redelivered. On solo,
threads and asyncio the tool's thread cannot be stopped: the caller is answered and the
worker serves on, but the thread keeps spinning (the tests show it still burning CPU).
An async tool that ignores cancellation is stopped on solo and threads (its event loop
never runs again); on the asyncio pool its loop is every call's, so it runs on there.
A tool that calls ``sys.exit`` gets a reply on every pool: ``test_pools.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from agent_client import ToolClient, ToolExecutionError, remote_tool
from toolexec import Pool

from .conftest import WorkerFactory
from .fault_support import FAULT_QUEUE, cpu_seconds, fault_env, unique
from .polling import wait_until

pytestmark = pytest.mark.integration


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited and been reaped."""
    return not Path(f"/proc/{pid}").exists()


def assert_spins_on(pid: int, redis_client: redis.Redis, marker: str) -> None:
    """Assert that ``fault_spin``'s thread in process ``pid`` still runs and burns CPU.

    The thread's own CPU time is read, not the process's: on a crowded machine (CI runs
    several test processes and their workers on two cores) a spinning thread may get a tenth
    of a core, so it is given 20 s to burn 0.2 s; a thread that ended is gone from /proc.
    """
    thread = int(redis_client.get(f"{marker}:thread") or 0)
    assert thread, "fault_spin never said which thread runs it"
    burnt = cpu_seconds(pid, thread)
    assert wait_until(lambda: cpu_seconds(pid, thread) - burnt >= 0.2, timeout=20)


def test_a_spinning_tool_past_its_hard_limit_is_answered_then_its_prefork_process_is_replaced(
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    worker = worker_factory(
        pool="prefork", concurrency=2, queues=(FAULT_QUEUE,), env=fault_env(settings_env)
    )
    marker = unique("faults:pid")
    spin = remote_tool("fault_spin", timeout=20)

    started = time.monotonic()
    with pytest.raises(ToolExecutionError) as raised:
        spin(marker=marker)
    answered = time.monotonic() - started

    assert raised.value.remote_type == "ToolHardTimeout"
    assert "was stopped" in raised.value.remote_message
    assert answered < 3.0, f"answered after {answered:.1f}s"
    spinning = int(redis_client.get(marker) or 0)
    assert spinning
    # The process that ran it leaves once the reply is out, and the pool is whole again.
    assert wait_until(lambda: gone(spinning))
    assert wait_until(lambda: len(worker.child_pids()) == 2)
    assert spinning not in worker.child_pids()
    for n in range(4):
        assert remote_tool("fault_echo", timeout=10)(text=f"after {n}")["text"] == f"after {n}"
    assert worker.is_running


def test_an_at_least_once_runaway_is_answered_once_and_never_redelivered(
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    # Concurrency 1: a redelivered copy would run before the next call does.
    worker = worker_factory(
        pool="prefork", concurrency=1, queues=(FAULT_QUEUE,), env=fault_env(settings_env)
    )
    counter = unique("faults:runs")
    spin = remote_tool("fault_spin_counted", timeout=20)
    assert spin.idempotent and spin.spec.delivery == "at_least_once"
    [child] = worker.child_pids()

    with pytest.raises(ToolExecutionError) as raised:
        spin(counter=counter)

    assert raised.value.remote_type == "ToolHardTimeout"
    assert wait_until(lambda: gone(child))
    assert remote_tool("fault_echo", timeout=10)(text="next")["text"] == "next"
    assert redis_client.get(counter) == b"1"  # ran once: not redelivered
    assert redis_client.llen(FAULT_QUEUE) == 0
    assert worker.is_running


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_on_solo_and_threads_a_spinning_thread_spins_on_but_a_coroutine_ignoring_cancellation_stops(
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    tool_client: ToolClient,
    redis_client: redis.Redis,
    pool: Pool,
) -> None:
    worker = worker_factory(
        pool=pool, concurrency=2, queues=(FAULT_QUEUE,), env=fault_env(settings_env)
    )
    pid = worker.pid
    assert pid is not None
    counter = unique("faults:steps")
    marker = unique("faults:pid")

    with pytest.raises(ToolExecutionError) as spun:
        remote_tool("fault_spin", timeout=20)(marker=marker)
    with pytest.raises(ToolExecutionError) as stubborn:
        remote_tool("fault_stubborn", timeout=20)(counter=counter)

    # Both callers are answered at the hard limit, and the worker serves on.
    assert spun.value.remote_type == stubborn.value.remote_type == "ToolHardTimeout"
    for n in range(3):
        assert remote_tool("fault_echo", timeout=10)(text=f"{n}")["text"] == f"{n}"
    # The sync tool's thread cannot be stopped: it still burns CPU in the worker's process.
    assert "its thread cannot be stopped on this pool and runs on" in spun.value.remote_message
    assert_spins_on(pid, redis_client, marker)
    # The coroutine is stopped: its loop never runs again (within a second it would take
    # about twenty more steps).
    assert "was stopped" in stubborn.value.remote_message
    steps = int(redis_client.get(counter) or 0)
    assert steps > 0  # it ran until its hard limit
    assert not wait_until(lambda: int(redis_client.get(counter) or 0) > steps, timeout=1.0)


def test_on_the_asyncio_pool_a_spinning_thread_and_a_coroutine_ignoring_cancellation_both_run_on(
    worker_factory: WorkerFactory,
    settings_env: dict[str, str],
    tool_client: ToolClient,
    redis_client: redis.Redis,
) -> None:
    # A documented limit (docs/guarantees.md): what the asyncio pool cannot stop.
    worker = worker_factory(
        pool="asyncio", concurrency=2, queues=(FAULT_QUEUE,), env=fault_env(settings_env)
    )
    pid = worker.pid
    assert pid is not None
    counter = unique("faults:steps")
    marker = unique("faults:pid")

    started = time.monotonic()
    with pytest.raises(ToolExecutionError) as spun:
        remote_tool("fault_spin", timeout=20)(marker=marker)
    with pytest.raises(ToolExecutionError) as stubborn:
        remote_tool("fault_stubborn", timeout=20)(counter=counter)
    answered = time.monotonic() - started

    # Both callers are answered at the hard limit (the coroutine after its 0.5 s to end),
    # and the worker serves on.
    assert spun.value.remote_type == stubborn.value.remote_type == "ToolHardTimeout"
    assert answered < 3.0, f"answered after {answered:.1f}s"
    for n in range(3):
        assert remote_tool("fault_echo", timeout=10)(text=f"{n}")["text"] == f"{n}"
    # Neither is stopped, and each caller is told so: the thread burns CPU, and the
    # coroutine keeps stepping on the worker's one event loop.
    assert "its thread cannot be stopped on this pool and runs on" in spun.value.remote_message
    assert "ignored it, and runs on in the worker's event loop" in stubborn.value.remote_message
    assert_spins_on(pid, redis_client, marker)
    steps = int(redis_client.get(counter) or 0)
    assert wait_until(lambda: int(redis_client.get(counter) or 0) > steps, timeout=2.0)
    # A warm stop would wait for the spinning thread for ever: the worker restarts cold.
    worker.kill()
