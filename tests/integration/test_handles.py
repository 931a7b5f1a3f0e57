"""Hold a call: submit, wait later, attach from another process.

Real workers of each pool on a Redis of the module's own (``handle_support.py``); the
tools (``handle_tools.py``) note each start, stop and end in a file, so that what ran is
read from the record, not assumed. Cancels: ``test_cancel.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from agent_client import (
    CallNotFound,
    ToolClient,
    ToolTimeoutError,
    attach,
    remote_tool,
)
from tests.integration.conftest import PROJECT_ROOT
from tests.integration.handle_support import (
    client,
    env,
    runs,
    server,
    token,
    worker,
)
from tests.integration.polling import wait_until
from toolexec.worker_process import WorkerProcess

__all__ = ["client", "env", "server", "worker"]  # the fixtures this module uses


# -- handles -------------------------------------------------------------------------------


def test_submit_returns_at_once_and_the_handle_gives_the_result_status_and_progress(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    slow = remote_tool("slow", client=client)
    mark = token()
    seen: list[float] = []
    started = time.monotonic()
    handle = slow.submit(
        {"token": mark, "seconds": 1.0}, timeout=30, on_progress=lambda e: seen.append(e.done)
    )
    assert time.monotonic() - started < 0.5, "submit waited for the call"
    assert handle.id and handle.tool == "slow"
    assert wait_until(lambda: handle.status() == "running", timeout=10), handle.status()

    with pytest.raises(TimeoutError):
        handle.result_sync(timeout=0.05)  # this waiter gives up; the call goes on
    assert handle.result_sync(timeout=20)["token"] == mark
    assert handle.status() == "done"
    assert seen, "no progress reached on_progress"
    assert runs(env, mark) == ["start", "end"]


def test_a_handle_is_awaited_from_async_code_and_the_calls_deadline_ends_it(
    worker: WorkerProcess, client: ToolClient
) -> None:
    slow = remote_tool("slow", client=client)

    async def main() -> None:
        handle = slow.submit({"token": token(), "seconds": 5.0}, timeout=0.6)
        with pytest.raises(TimeoutError) as waiter:
            await handle.result(timeout=0.1)
        assert not isinstance(waiter.value, ToolTimeoutError)
        began = time.monotonic()
        with pytest.raises(ToolTimeoutError) as expired:
            await handle.result()
        assert time.monotonic() - began < 1.0
        assert expired.value.call_id == handle.id
        assert await handle.status_async() == "expired"

    asyncio.run(main())


def test_another_process_attaches_to_a_call_whose_sender_was_sigkilled(
    worker: WorkerProcess, client: ToolClient, env: dict[str, str]
) -> None:
    mark = token()
    sender = subprocess.run(
        [sys.executable, "-c", SENDER, mark],
        check=False,
        env={**os.environ, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sender.returncode == -9, sender.stderr
    call_id = sender.stdout.strip()
    assert call_id

    handle = attach(call_id, client=client)
    assert handle.tool == "slow"
    assert handle.result_sync(timeout=20)["token"] == mark
    assert handle.status() == "done"
    assert runs(env, mark) == ["start", "end"]
    again = attach(call_id, client=client)  # after the end: the kept outcome
    assert again.result_sync(timeout=1)["token"] == mark


SENDER = """
import os, signal, sys
from agent_client import remote_tool
handle = remote_tool("slow").submit({"token": sys.argv[1], "seconds": 1.0}, timeout=60)
import time
while handle.status() != "running":  # sent and taken: the sender dies while it runs
    time.sleep(0.01)
print(handle.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_attaching_to_a_call_nobody_submitted_names_what_is_wrong(client: ToolClient) -> None:
    with pytest.raises(CallNotFound, match="TOOLEXEC_HANDLE_TTL"):
        attach("no-such-call", client=client)
