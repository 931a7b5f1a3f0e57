"""Cancel, for real: a queued call never starts, a running one stops, on every pool.

Real workers of each pool on a Redis of the module's own (``handle_support.py``); the
tools (``handle_tools.py``) note each start, stop and end in a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import redis

from agent_client import (
    ToolCancelled,
    ToolClient,
    ToolTimeoutError,
    attach,
    remote_tool,
    remote_tools,
    sent_calls,
)
from tests.integration.conftest import PROJECT_ROOT, stop_quickly
from tests.integration.handle_support import (
    MODULES,
    QUEUE,
    client,
    env,
    runs,
    server,
    token,
    worker,
)
from tests.integration.polling import wait_until
from toolexec.redis_server import RedisServer
from toolexec.worker_process import WorkerProcess
from wire import keys
from wire.models import WorkerInfo
from wire.settings import Settings

__all__ = ["client", "env", "server", "worker"]  # the fixtures this module uses


# -- cancel --------------------------------------------------------------------------------


def test_a_cancelled_sync_tool_sees_its_event_and_its_waiters_get_tool_cancelled(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    handle = remote_tool("slow", client=client).submit({"token": mark, "seconds": 20.0}, timeout=60)
    assert wait_until(lambda: runs(env, mark) == ["start"], timeout=10)
    other = attach(handle.id, client=client)
    began = time.monotonic()
    assert handle.cancel() is True
    with pytest.raises(ToolCancelled):
        handle.result_sync(timeout=10)
    assert time.monotonic() - began < 1.5
    with pytest.raises(ToolCancelled):
        other.result_sync(timeout=5)
    assert runs(env, mark) == ["start", "stopped"]
    assert handle.status() == "cancelled"
    assert handle.cancel() is False  # ended already


def test_a_cancelled_queued_call_never_starts(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    slow = remote_tool("slow", client=client)
    busy = [token(), token()]
    holders = [slow.submit({"token": t, "seconds": 1.5}, timeout=30) for t in busy]  # both slots
    assert wait_until(lambda: all(runs(env, t) for t in busy), timeout=10)
    mark = token()
    queued = slow.submit({"token": mark, "seconds": 0.1}, timeout=30)
    assert queued.status() == "queued"
    assert queued.cancel() is True
    with pytest.raises(ToolCancelled):
        queued.result_sync(timeout=10)
    for holder in holders:
        holder.result_sync(timeout=20)
    after = slow.submit({"token": token(), "seconds": 0.1}, timeout=30)
    after.result_sync(timeout=20)  # the queue moved past where the cancelled call was
    assert runs(env, mark) == []


def test_an_async_tool_gets_cancelled_error(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    handle = remote_tool("waits", client=client).submit(
        {"token": mark, "seconds": 30.0}, timeout=60
    )
    assert wait_until(lambda: runs(env, mark) == ["start"], timeout=10)
    handle.cancel()
    with pytest.raises(ToolCancelled):
        handle.result_sync(timeout=5)
    assert runs(env, mark) == ["start", "cancelled"]


def test_a_cancelled_idempotent_call_stores_nothing_and_the_same_call_runs_again(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    keyed = remote_tool("keyed", client=client)
    mark = token()
    first = keyed.submit({"token": mark, "seconds": 20.0}, timeout=60, run_id=f"run-{mark}")
    assert wait_until(lambda: runs(env, mark) == ["start"], timeout=10)
    first.cancel()
    with pytest.raises(ToolCancelled):
        first.result_sync(timeout=5)
    assert (
        keyed.invoke_sync({"token": mark, "seconds": 0.1}, timeout=30, run_id=f"run-{mark}") == mark
    )
    assert runs(env, mark) == ["start", "stopped", "start", "end"]


def test_on_abandon_cancel_stops_the_work_when_the_callers_deadline_passes(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    with pytest.raises(ToolTimeoutError):
        remote_tool("abandoned", client=client).invoke_sync(
            {"token": mark, "seconds": 30.0}, timeout=1.0
        )
    assert wait_until(lambda: runs(env, mark) == ["start", "stopped"], timeout=5), runs(env, mark)


@pytest.mark.parametrize("level", ["call", "proxy", "toolset"])
def test_the_caller_chooses_on_abandon_per_call_per_proxy_and_per_toolset(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str], level: str
) -> None:
    # `slow` leaves an abandoned call running by its own setting; the agent side asks
    # for it to be cancelled instead, at each level. And `abandoned`, which cancels by
    # its own setting, is left running when the call says so.
    mark, kept = token(), token()
    arguments = {"token": mark, "seconds": 30.0}
    if level == "call":
        slow = remote_tool("slow", client=client)
        with pytest.raises(ToolTimeoutError):
            slow.invoke_sync(arguments, timeout=1.0, on_abandon="cancel")
        with pytest.raises(ToolTimeoutError):
            remote_tool("abandoned", client=client).invoke_sync(
                {"token": kept, "seconds": 3.0}, timeout=1.0, on_abandon="leave"
            )
        assert wait_until(lambda: runs(env, kept) == ["start", "end"], timeout=10), runs(env, kept)
    else:
        if level == "proxy":
            slow = remote_tool("slow", client=client, on_abandon="cancel")
        else:
            slow = remote_tools(client=client, queues=["handles"], on_abandon={"slow": "cancel"})[
                "slow"
            ]
        assert slow.on_abandon == "cancel"
        with pytest.raises(ToolTimeoutError):
            slow.invoke_sync(arguments, timeout=1.0)
    assert wait_until(lambda: runs(env, mark) == ["start", "stopped"], timeout=5), runs(env, mark)


def test_an_on_abandon_that_is_neither_leave_nor_cancel_is_refused_naming_it(
    client: ToolClient,
) -> None:
    with pytest.raises(
        ValueError, match="on_abandon for tool 'slow' must be 'leave', 'cancel' or None; got 'stop'"
    ):
        remote_tool("slow", client=client, on_abandon="stop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_abandon names tools not in this toolset: 'nope'"):
        remote_tools(client=client, queues=["handles"], on_abandon={"nope": "cancel"})


def test_on_abandon_cancel_stops_the_work_when_the_awaiting_task_is_cancelled(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    tool = remote_tool("abandoned", client=client)

    async def main() -> None:
        task = asyncio.ensure_future(tool.invoke({"token": mark, "seconds": 30.0}, timeout=60))
        while runs(env, mark) != ["start"]:
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: runs(env, mark) == ["start", "stopped"], timeout=5), runs(env, mark)


# -- prefork: a tool that ignores its cancel ---------------------------------------------


def test_a_cancelled_busy_loop_on_prefork_loses_its_process_within_grace_and_the_pool_serves_the_next_call(  # noqa: E501
    own_server: RedisServer, tmp_path: Path
) -> None:
    env = {
        "TOOLEXEC_BROKER_URL": own_server.url,
        "TOOLEXEC_REDIS_URL": own_server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
        "TOOLEXEC_TOOL_MODULES": MODULES,
    }
    process = WorkerProcess(
        name=f"handles-busy-{uuid.uuid4().hex[:6]}",
        pool="prefork",
        concurrency=1,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path / "workers",
    )
    process.start(wait=True, timeout=60)
    tool_client = ToolClient(Settings.from_env(env))
    try:
        mark = token()
        handle = remote_tool("busy", client=tool_client).submit(
            {"token": mark, "seconds": 60.0}, timeout=120
        )
        assert wait_until(lambda: runs(env, mark) == ["start"], timeout=10)
        (child,) = process.child_pids()
        began = time.monotonic()
        handle.cancel()
        with pytest.raises(ToolCancelled):
            handle.result_sync(timeout=5)
        assert wait_until(
            lambda: (
                not psutil.pid_exists(child)
                or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
            ),
            timeout=5,
        )
        assert time.monotonic() - began < 1.0 + 1.0, "the process outlived grace + 1 s"
        assert remote_tool("slow", client=tool_client).invoke_sync(
            {"token": token(), "seconds": 0.1}, timeout=30
        )
        assert runs(env, mark) == ["start"]
    finally:
        tool_client.close()
        stop_quickly(process)


def test_toolexec_cancel_stops_a_call_and_says_when_it_had_ended(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    handle = remote_tool("slow", client=client).submit({"token": mark, "seconds": 20.0}, timeout=60)
    assert wait_until(lambda: runs(env, mark) == ["start"], timeout=10)

    def cancel(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "toolexec.cli", "cancel", *words],
            env={**os.environ, **env},
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    first = cancel(handle.id, "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"call_id": handle.id, "cancelled": True, "was": "running"}
    with pytest.raises(ToolCancelled):
        handle.result_sync(timeout=5)
    assert runs(env, mark) == ["start", "stopped"]
    again = cancel(handle.id)
    assert (
        again.returncode == 1
        and f"call {handle.id} had ended (cancelled): nothing to cancel" in again.stderr
    )
    unknown = cancel("no-such-id")
    assert unknown.returncode == 4, unknown.stderr
    assert (
        "no call no-such-id is known" in unknown.stderr
        and "nothing was cancelled" in unknown.stderr
    )
    assert "cancelled no-such-id" not in unknown.stdout


def test_a_sync_tool_that_ignores_its_cancel_is_answered_after_its_grace_and_shown_in_status(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    handle = remote_tool("busy", client=client).submit({"token": mark, "seconds": 4.0}, timeout=60)
    assert wait_until(lambda: runs(env, mark) == ["start"], timeout=10)
    children = set(worker.child_pids())
    began = time.monotonic()
    handle.cancel()
    with pytest.raises(ToolCancelled, match="did not end within its grace"):
        handle.result_sync(timeout=10)
    assert time.monotonic() - began < 1.0 + 0.8  # the grace, and the way back
    if worker.pool == "prefork":  # its process is stopped and replaced
        assert wait_until(
            lambda: set(worker.child_pids()) - children and len(worker.child_pids()) == 2,
            timeout=10,
        )
        assert runs(env, mark) == ["start"]
    else:  # a thread cannot be stopped: it runs on, and the worker's heartbeat says so
        assert wait_until(lambda: ignoring_cancel(env, worker.pid) == 1, timeout=5)
        assert wait_until(lambda: runs(env, mark) == ["start", "end"], timeout=10)
        assert wait_until(lambda: ignoring_cancel(env, worker.pid) == 0, timeout=5)
    assert remote_tool("slow", client=client).invoke_sync(
        {"token": token(), "seconds": 0.1}, timeout=30
    )


def ignoring_cancel(env: dict[str, str], pid: int | None) -> int | None:
    """What the heartbeat of the worker of main process ``pid`` says runs on past a cancel."""
    with redis.Redis.from_url(env["TOOLEXEC_REDIS_URL"]) as store:
        for worker_id in store.smembers(keys.WORKERS):
            text = store.get(keys.worker(worker_id.decode()))
            info = WorkerInfo.model_validate_json(text) if text else None
            if info is not None and info.pid == pid:
                return info.ignoring_cancel
    return None


def test_a_plain_calls_id_is_known_while_it_runs_and_cancels_it_and_its_error_names_it(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    slow = remote_tool("slow", client=client)

    async def main() -> ToolCancelled:
        with sent_calls() as sent:
            task = asyncio.ensure_future(slow.invoke({"token": mark, "seconds": 30.0}, timeout=60))
            while runs(env, mark) != ["start"]:
                await asyncio.sleep(0.02)
            assert [s.tool for s in sent] == ["slow"]
            command = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "toolexec.cli",
                "cancel",
                sent[0].call_id,
                env={**os.environ, **env},
                cwd=PROJECT_ROOT,
                stderr=asyncio.subprocess.PIPE,
            )
            _, stderr = await command.communicate()
            assert command.returncode == 0, stderr
            with pytest.raises(ToolCancelled) as raised:
                await task
            assert raised.value.call_id == sent[0].call_id
            return raised.value

    asyncio.run(main())
    assert runs(env, mark) == ["start", "stopped"]
