"""A proxy made before ``fork()``, used by the parent and its children at once.

A module-level proxy (``search = remote_tool("search")``, as the README shows) keeps the
process's client; a forked child (gunicorn, multiprocessing, a Celery-prefork agent)
inherits it. Each process must get its own client id, reply list, listener and
connections, or they take each other's replies. These tests fork for real while the
parent's listener runs and calls are in flight.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
from typing import Any

import pytest

from agent_client import RemoteTool, ToolClient, remote_tool
from toolexec import WorkerProcess

pytestmark = pytest.mark.integration

#: What children inherit: the proxy made in the parent before forking.
_ECHO: RemoteTool | None = None


def _calls(who: str, count: int) -> list[dict[str, Any]]:
    """``count`` calls through the inherited proxy, sync and async, each with its own text."""
    assert _ECHO is not None
    echo = _ECHO
    results = [echo(text=f"{who}-sync-{i}", number=i) for i in range(count)]

    async def concurrently() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(
                *(echo.run(text=f"{who}-async-{i}", number=i) for i in range(count))
            )
        )

    return results + asyncio.run(concurrently())


def _all_own(who: str, count: int, results: list[dict[str, Any]]) -> bool:
    expected = [f"{who}-sync-{i}" for i in range(count)] + [
        f"{who}-async-{i}" for i in range(count)
    ]
    return [r["text"] for r in results] == expected and [r["number"] for r in results] == [
        *range(count)
    ] * 2


#: Set in each pool process (``_join_pool``): three jobs start only once three processes
#: hold one each, so no process takes two of them.
_TOGETHER: Any = None


def _join_pool(together: Any) -> None:
    global _TOGETHER
    _TOGETHER = together


def _child_in_pool(index: int) -> tuple[str, bool, str]:
    """A multiprocessing worker's job: its own calls, and the client id it used."""
    assert _TOGETHER is not None
    _TOGETHER.wait(60)  # one job per process: a process runs one job at a time
    who = f"pool-{index}-{os.getpid()}"
    results = _calls(who, 15)
    assert _ECHO is not None
    return who, _all_own(who, 15, results), _ECHO.client.client_id


def test_a_proxy_made_before_os_fork_serves_parent_and_child_at_once_with_their_own_replies(
    tool_client: ToolClient, probe_worker: WorkerProcess
) -> None:
    global _ECHO
    _ECHO = remote_tool("probe_echo", timeout=20)
    assert _ECHO(text="parent-warm", number=0)["text"] == "parent-warm"  # listener running
    parent_id = tool_client.client_id
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            results = _calls("child", 20)
            report = {"own": _all_own("child", 20, results), "client_id": _ECHO.client.client_id}
            os.write(write, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        results = _calls("parent", 20)  # while the child calls too
    finally:
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            report = json.loads(pipe.read() or "{}")

    assert os.waitstatus_to_exitcode(status) == 0
    assert _all_own("parent", 20, results)
    assert report["own"] is True
    assert report["client_id"] != parent_id  # its own reply list
    assert tool_client.client_id == parent_id  # the parent keeps its own
    assert tool_client.replies.pending == 0


def test_a_proxy_made_before_a_multiprocessing_pool_serves_the_parent_and_every_child_at_once(
    tool_client: ToolClient, probe_worker: WorkerProcess
) -> None:
    global _ECHO
    _ECHO = remote_tool("probe_echo", timeout=20)
    assert _ECHO(text="parent-warm", number=0)["text"] == "parent-warm"
    parent_id = tool_client.client_id
    context = multiprocessing.get_context("fork")

    with context.Pool(3, initializer=_join_pool, initargs=(context.Barrier(3),)) as pool:
        children = pool.map_async(_child_in_pool, range(3))
        results = _calls("parent", 20)  # while the children call too
        reports = children.get(timeout=120)

    assert _all_own("parent", 20, results)
    assert all(own for _, own, _ in reports), reports
    client_ids = {client_id for _, _, client_id in reports}
    assert len(client_ids) == 3 and parent_id not in client_ids
    assert tool_client.replies.pending == 0
