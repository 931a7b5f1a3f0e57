"""How a toolexec call reads as an MCP task (``toolexec.mcp.tasks``), without a server.

A fake handle stands for ``agent_client.CallHandle``: the store reads only whether it is
done and its result.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from agent_client import ProgressEvent, ToolCancelled, ToolTimeoutError
from agent_client.errors import ToolExecutionError
from toolexec.mcp.calling import tool_result
from toolexec.mcp.tasks import TASKS_EXTENSION, Task, TaskStore, declares_tasks, require_tasks

MODERN = "2026-07-28"
HANDSHAKE = "2025-11-25"


class FakeHandle:
    """A call that has ended with ``value``, or ``error``; or not ended (``pending``)."""

    def __init__(
        self, *, value: Any = None, error: BaseException | None = None, pending: bool = False
    ):
        self.id = "c" * 32
        self.tool = "probe"
        self._value, self._error, self._pending = value, error, pending

    def done(self) -> bool:
        return not self._pending

    def result_sync(self, timeout: float | None = None) -> Any:
        if self._pending:
            raise TimeoutError
        if self._error is not None:
            raise self._error
        return self._value


def store() -> TaskStore:
    client = SimpleNamespace(settings=SimpleNamespace(handle_ttl=600))
    return TaskStore(client, tool_result)  # type: ignore[arg-type]


def settled(handle: FakeHandle) -> Task:
    task = Task(handle, ttl=600)  # type: ignore[arg-type]
    store().settle(task)
    return task


def test_a_call_that_returned_is_a_completed_task_with_the_plain_calls_result() -> None:
    task = settled(FakeHandle(value=[1, 2]))

    wire = task.wire()
    assert wire["status"] == "completed"
    assert wire["result"]["structuredContent"] == {"result": [1, 2]}
    assert wire["result"] == tool_result([1, 2], None).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )


@pytest.mark.parametrize(
    "error",
    [ToolExecutionError("probe", "ValueError", "bad"), ToolTimeoutError("probe", 1.0)],
    ids=["tool raised", "deadline passed"],
)
def test_a_call_that_failed_is_completed_with_an_error_result_not_failed(error: Exception) -> None:
    wire = settled(FakeHandle(error=error)).wire()

    assert wire["status"] == "completed"  # the spec keeps "failed" for JSON-RPC errors
    assert wire["result"]["isError"] is True
    assert wire["result"]["structuredContent"]["error"]["type"] == type(error).__name__


def test_a_cancelled_call_is_a_cancelled_task_without_a_result() -> None:
    wire = settled(FakeHandle(error=ToolCancelled("probe", "by request"))).wire()

    assert wire["status"] == "cancelled" and "result" not in wire
    assert "by request" in wire["statusMessage"]


def test_a_toolexec_bug_is_answered_as_a_plain_call_would_be() -> None:
    wire = settled(FakeHandle(error=RuntimeError("oops"))).wire()

    assert wire["status"] == "completed" and wire["result"]["isError"] is True
    assert "toolexec failed: oops" in wire["result"]["content"][0]["text"]


def test_a_working_task_says_where_its_call_is_and_its_latest_progress() -> None:
    task = settled(FakeHandle(pending=True))
    assert task.wire()["status"] == "working" and "queued" in task.wire()["statusMessage"]

    assert task.ran("running") and not task.ran("running")  # only a change counts
    task.reported(ProgressEvent(3, 10, "step 3"))

    assert task.wire()["statusMessage"] == "running on a worker; progress 3/10 step 3"


def test_an_ended_task_never_changes_again() -> None:
    task = settled(FakeHandle(value=1))
    before = task.wire()

    task.end("cancelled", "too late")
    task.reported(ProgressEvent(1, None, None))
    assert not task.ran("running")

    assert task.wire() == before


def test_the_ttl_counts_from_creation_to_the_last_change_plus_the_handle_ttl() -> None:
    task = Task(FakeHandle(pending=True), ttl=600)  # type: ignore[arg-type]
    task.created, task.updated = time.time() - 5, time.time()

    wire = task.wire()
    assert 604_900 < wire["ttlMs"] <= 605_100
    assert wire["createdAt"].endswith("Z") and wire["createdAt"] < wire["lastUpdatedAt"]


def context(version: str, extensions: dict[str, Any] | None) -> Any:
    capabilities = types.ClientCapabilities(extensions=extensions)
    return SimpleNamespace(
        protocol_version=version, session=SimpleNamespace(client_capabilities=capabilities)
    )


def test_only_a_2026_request_that_declares_the_extension_gets_tasks() -> None:
    assert declares_tasks(context(MODERN, {TASKS_EXTENSION: {}}))
    assert not declares_tasks(context(MODERN, None))
    assert not declares_tasks(context(MODERN, {"io.modelcontextprotocol/ui": {}}))
    assert not declares_tasks(context(HANDSHAKE, {TASKS_EXTENSION: {}}))  # not defined there


@pytest.mark.parametrize(
    ("version", "extensions", "code"),
    [
        (MODERN, None, types.MISSING_REQUIRED_CLIENT_CAPABILITY),
        (HANDSHAKE, {TASKS_EXTENSION: {}}, types.METHOD_NOT_FOUND),
    ],
    ids=["undeclared", "handshake era"],
)
def test_a_tasks_request_that_may_not_be_sent_is_the_specs_error(
    version: str, extensions: dict[str, Any] | None, code: int
) -> None:
    with pytest.raises(MCPError) as refused:
        require_tasks(context(version, extensions), "tasks/get")

    assert refused.value.error.code == code
    if code == types.MISSING_REQUIRED_CLIENT_CAPABILITY:
        assert refused.value.error.data == {
            "requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}
        }
