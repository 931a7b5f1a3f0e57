"""``TOOLEXEC_LOG_FORMAT=json``: a real worker's log, one JSON object per record.

A worker at ``-l INFO`` runs a call that fails (toolexec logs that at INFO, with the
call's ids) with a secret in its arguments and its error message. Its log must carry the
call's ``call_id``, ``run_id`` and ``tool`` as JSON fields, Celery's own records as JSON
too, and the secret nowhere.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent_client import ToolClient, ToolExecutionError, remote_tool
from tests.integration.conftest import PROJECT_ROOT
from toolexec import WorkerProcess
from wire.settings import Settings

pytestmark = pytest.mark.integration

SECRET = "4111-1111-1111-" + uuid.uuid4().hex[:8]
QUEUE = "security"


@pytest.fixture(scope="module")
def env(settings_env: dict[str, str]) -> dict[str, str]:
    """The session's settings with the security tools and JSON logs."""
    return {
        **settings_env,
        "TOOLEXEC_TOOL_MODULES": "tasks,tests.integration.security_tools",
        "TOOLEXEC_LOG_FORMAT": "json",
    }


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A prefork worker logging JSON at INFO, on the ``security`` queue."""
    started = WorkerProcess(
        name=f"jsonlogs-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=2,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("jsonlogs-worker"),
        loglevel="INFO",
    )
    with started:
        yield started


def records(text: str) -> list[dict[str, Any]]:
    """The JSON records among a worker's output lines (its banner and ready line are text)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def test_a_json_log_names_the_call_id_run_id_and_tool_of_each_record_about_a_call_and_no_tool_data(
    worker: WorkerProcess, env: dict[str, str]
) -> None:
    client = ToolClient(Settings.from_env(env))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    try:
        assert remote_tool("echo", client=client).invoke_sync({"text": SECRET}, run_id=run_id) == {
            "echo": SECRET
        }
        with pytest.raises(ToolExecutionError):
            remote_tool("fail", client=client).invoke_sync({"text": SECRET}, run_id=run_id)
    finally:
        client.close()

    log = worker.log_path.read_text()
    found = records(log)
    about_fail = [r for r in found if r.get("tool") == "fail"]
    assert about_fail, "no record names the failed call's tool"
    assert {r["run_id"] for r in about_fail} == {run_id}
    assert all(r["call_id"].startswith(client.client_id) for r in about_fail)
    assert any(
        r["message"].endswith("raised ValueError") and r["level"] == "INFO" for r in about_fail
    ), about_fail
    # Celery's own records are JSON too: each received task, in the worker's main process.
    received = [r for r in found if "received" in r["message"] and r["logger"].startswith("celery")]
    assert len(received) >= 2, [r["message"] for r in found]
    assert {"time", "level", "logger", "process", "message"} <= set(received[0])
    assert SECRET not in log, [line for line in log.splitlines() if SECRET in line]
