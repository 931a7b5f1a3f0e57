"""Flower tells the truth: each call under its tool's name, a failed tool as a failure.

The client names each call after its tool (protocol 2's ``shadow`` header) and a task
whose call failed ends as a failure after delivering its outcome, with only the
error's type and kind (``ToolCallFailed``). Here a real worker with task events on
serves the starter tools, and Flower's API and the worker's own log (at INFO, where
Celery reports a task's failure) are read back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from agent_client import ToolClient, ToolExecutionError, remote_tool, sent_calls
from tests.integration.workers import module_worker
from toolexec import WorkerProcess

from .support import EventsWorker, kwargsrepr_of, send_like_the_client, wait_until
from .test_monitoring import flower, flower_get, stock_request

__all__ = ["flower"]  # Flower's fixture, shared with test_monitoring: tests here ask for it by name

#: A query with no words: ``search`` raises ValueError quoting it.
SECRET = "«§¶†‡»~~"


@pytest.fixture(scope="module")
def events_worker(
    contract_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The events worker of :mod:`tests.contract.conftest`, logging at INFO."""
    with module_worker(
        tmp_path_factory, "contract-truth", env=contract_env, kind=EventsWorker, loglevel="INFO"
    ) as worker:
        yield worker


def task_in_state(base: str, task_id: str, state: str) -> dict[str, Any] | None:
    """Flower's view of ``task_id`` once it is in ``state``."""
    task = flower_get(base, f"/api/task/info/{task_id}")
    return task if task is not None and task.get("state") == state else None


def test_flower_lists_each_call_under_its_tools_name_for_client_and_send_task_alike(
    flower: str, agent: ToolClient, producer: Celery
) -> None:
    request = stock_request("search", {"query": "fox"}, timeout=30.0)
    send_like_the_client(producer, request, task_name="toolexec.run_tool", queue="default")
    with sent_calls() as sent:
        assert remote_tool("search", client=agent).invoke_sync({"query": "fox"}, timeout=30.0)
    (call,) = sent

    assert wait_until(
        lambda: (
            task_in_state(flower, call.call_id, "SUCCESS")
            and task_in_state(flower, request.call_id, "SUCCESS")
        ),
        timeout=15.0,
    )
    client, stock = (
        task_in_state(flower, call.call_id, "SUCCESS"),
        task_in_state(flower, request.call_id, "SUCCESS"),
    )
    assert client is not None and stock is not None
    assert client["name"] == stock["name"] == "search"
    assert (client["args"], client["kwargs"]) == ("()", kwargsrepr_of("search"))
    listed = flower_get(flower, "/api/tasks?taskname=search") or {}
    assert {call.call_id, request.call_id} <= listed.keys()


def test_flower_shows_a_failed_tool_as_a_failure_with_its_error_type_and_no_arguments(
    flower: str, events_worker: WorkerProcess, agent: ToolClient
) -> None:
    search = remote_tool("search", client=agent)
    with sent_calls() as sent, pytest.raises(ToolExecutionError, match="ValueError") as failed:
        search.invoke_sync({"query": SECRET}, timeout=30.0)
    assert SECRET in failed.value.remote_message  # the caller is told all
    (call,) = sent

    assert wait_until(lambda: task_in_state(flower, call.call_id, "FAILURE"), timeout=15.0), (
        flower_get(flower, f"/api/task/info/{call.call_id}")
    )
    task = task_in_state(flower, call.call_id, "FAILURE")
    assert task is not None
    assert task["name"] == "search"
    assert task["exception"] == "ToolCallFailed('ValueError (execution)')"
    assert (task["args"], task["kwargs"]) == ("()", kwargsrepr_of("search"))
    assert SECRET not in json.dumps(task, ensure_ascii=False)
    # Celery logs the failure as expected (INFO, no traceback), with the type only.
    log = events_worker.log_path.read_text(errors="replace")
    assert (
        f"search[{call.call_id}] raised expected: ToolCallFailed('ValueError (execution)')" in log
    )
    assert SECRET not in log
    assert "Traceback" not in log
