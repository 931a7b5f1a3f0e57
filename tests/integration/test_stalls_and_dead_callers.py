"""A worker that stalls is not a dead one; a caller that dies has its queued calls shed.

* **A tool holding the interpreter's lock in C code** past its hard limit, on the pools
  that run tools in the worker's own process: the worker's keeper keeps it visible
  (``executor.keeper``), and no client's watchdog gives up a call while a worker of its
  queue has not beaten since it missed it, so its caller gets the outcome, not
  ``WorkerLost``, and the next call finds the tool (no ``ToolNotFound``).
* **A caller SIGKILLed** with its calls queued: its liveness key lapses within a
  heartbeat interval, and the workers shed its queued calls unrun (``executor.callers``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_client import ToolClient, ToolExecutionError, WorkerLost, remote_tool
from tests.integration.conftest import PROJECT_ROOT, WorkerFactory
from tests.integration.deploy_support import QUEUE
from tests.integration.polling import wait_until
from toolexec import Pool

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "asyncio"]


@pytest.mark.parametrize("pool", ["threads", "asyncio", "solo"])
def test_a_tool_holding_the_interpreter_lock_past_its_hard_limit_is_not_a_lost_worker(
    worker_factory: WorkerFactory,
    fleet_env: dict[str, str],
    fleet_client: ToolClient,
    tmp_path: Path,
    pool: Pool,
) -> None:
    worker_factory(pool=pool, queues=(QUEUE,), env=fleet_env)
    hold = remote_tool("deploy_gil", client=fleet_client, timeout=20)

    try:  # its outcome: the result, or its hard limit where the pool cannot stop a thread
        outcome: object = hold(token="gil", seconds=5)
    except ToolExecutionError as exc:
        outcome = exc
        assert exc.remote_type == "ToolHardTimeout"
    assert not isinstance(outcome, WorkerLost)
    assert _starts(tmp_path, "gil") == 1
    # The catalog kept the worker: the next call finds its tool at once.
    assert (
        remote_tool("deploy_plain", client=fleet_client, timeout=10)(token="next", seconds=0.0)[
            "token"
        ]
        == "next"
    )


_DEAD_CALLER = """
import asyncio
from agent_client import configure, remote_tool
configure()
work = remote_tool("deploy_plain", timeout=600)

async def main():
    calls = [
        asyncio.ensure_future(work.invoke({"token": f"q{i}", "seconds": 0.5})) for i in range(96)
    ]
    await asyncio.gather(*calls)

asyncio.run(main())
"""


@pytest.mark.parametrize("pool", POOLS)
def test_the_queued_calls_of_a_caller_killed_are_shed_within_about_an_interval(
    worker_factory: WorkerFactory, fleet_env: dict[str, str], tmp_path: Path, pool: Pool
) -> None:
    worker_factory(pool=pool, concurrency=1, queues=(QUEUE,), env=fleet_env)
    caller = subprocess.Popen(
        [sys.executable, "-c", _DEAD_CALLER], env={**os.environ, **fleet_env}, cwd=PROJECT_ROOT
    )
    try:
        assert wait_until(lambda: _started(tmp_path) >= 3, timeout=30)
    finally:
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
    at_death = _started(tmp_path)
    # Its liveness lapses within an interval (1 s here), and a worker asks a caller again
    # a third of an interval after it last found it alive: by then the rest are shed.
    time.sleep(1.0 + 1.0 / 3)  # the shedding's own bound, not a wait for a condition
    shed_by = _started(tmp_path)
    assert wait_until(lambda: _started(tmp_path) > shed_by, timeout=3) is False  # none starts now
    assert shed_by - at_death <= 3, (at_death, shed_by)  # 0.5 s each, one at a time
    assert _started(tmp_path) < 96


_MANY_DEAD = """
import asyncio, sys
from agent_client import configure, remote_tool
configure()
work = remote_tool("deploy_plain", timeout=600)

async def main():
    calls = [
        asyncio.ensure_future(work.invoke({"token": f"m{i}", "seconds": 0.5 if i % 2 else 2.0}))
        for i in range(200)
    ]
    await asyncio.sleep(0.5)
    print("sent", flush=True)
    await asyncio.gather(*calls)

asyncio.run(main())
"""


@pytest.mark.parametrize("pool", ["asyncio", "threads"])
def test_a_dead_callers_calls_taken_by_a_wide_pool_never_start_past_the_bound(
    worker_factory: WorkerFactory, fleet_env: dict[str, str], tmp_path: Path, pool: Pool
) -> None:
    # A wide pool takes nearly every call at once, while the caller lives; the calls then
    # wait for a tool thread. Each is checked as its thread takes it: none starts later
    # than the documented bound after the caller's death (an interval and a third; 1 s
    # intervals here), though the pool had taken them all before it.
    worker_factory(
        pool=pool, concurrency=500 if pool == "asyncio" else 32, queues=(QUEUE,), env=fleet_env
    )
    caller = subprocess.Popen(
        [sys.executable, "-c", _MANY_DEAD],
        env={**os.environ, **fleet_env},
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert caller.stdout is not None and caller.stdout.readline().strip() == "sent"
        assert wait_until(lambda: _started(tmp_path) >= 32, timeout=30)
        time.sleep(1.5)  # the caller lives on for a moment: the pool takes its calls meanwhile
    finally:
        os.kill(caller.pid, signal.SIGKILL)
        killed_at = time.time()
        caller.communicate()
    bound = 1.0 + 1.0 / 3
    # Long enough for any of the 200 to have started, had they not been shed.
    assert wait_until(lambda: _started(tmp_path) >= 200, timeout=6 * bound) is False
    late = [at - killed_at for at in _start_times(tmp_path) if at > killed_at + bound + 0.25]
    assert late == [], (
        f"{len(late)} calls started past the bound, the last {max(late):.2f}s after the death"
    )
    assert _started(tmp_path) < 200


def _start_times(tmp_path: Path) -> list[float]:
    folder = tmp_path / "data" / "runs"
    lines = (line.split() for path in folder.iterdir() for line in path.read_text().splitlines())
    return [float(at) for what, _, at in lines if what == "start"]


def _started(tmp_path: Path) -> int:
    folder = tmp_path / "data" / "runs"
    return (
        sum(path.read_text().split().count("start") for path in folder.iterdir())
        if folder.exists()
        else 0
    )


def _starts(tmp_path: Path, token: str) -> int:
    return (tmp_path / "data" / "runs" / token).read_text().split().count("start")
