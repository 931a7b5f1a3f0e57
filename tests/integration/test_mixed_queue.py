"""Two workers on one queue that serve different tools: the error and the doctor say so.

Every worker on a queue must serve the same tools (docs/deploy.md): a call goes to
whichever worker takes it first. Here one worker serves ``mixed_shared`` and
``mixed_extra`` and the other only ``mixed_shared``, both on ``mixed``. A call of
``mixed_extra`` the second one takes fails with ``ToolNotFound``; its message must
name that worker and say that others serve the tool, and ``toolexec doctor`` must name
the worker and the tool it lacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from agent_client import ToolClient, ToolNotFound, remote_tool
from tests.integration.conftest import PROJECT_ROOT, WorkerFactory

pytestmark = pytest.mark.integration

_QUEUE = "mixed"
_FULL = "tests.integration.mixed_tools,tests.integration.mixed_extra_tools"
_PARTIAL = "tests.integration.mixed_tools"
#: Calls made; the two idle workers' reads are served in turn, so both take some.
_CALLS = 40


def same_tools_check(env: dict[str, str]) -> dict[str, Any]:
    """``toolexec doctor --json``'s ``same-tools-per-queue`` check, run as a user runs it
    (in a process of its own: the doctor imports the tool modules it is given)."""
    done = subprocess.run(
        [sys.executable, "-m", "toolexec", "doctor", "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
    )
    assert "Traceback" not in done.stderr, done.stderr
    checks = {check["name"]: check for check in json.loads(done.stdout)}
    check: dict[str, Any] = checks["same-tools-per-queue"]
    return check


def test_a_worker_lacking_a_tool_of_its_queue_is_named_by_the_error_and_by_the_doctor(
    worker_factory: WorkerFactory, own_env: dict[str, str], own_client: ToolClient
) -> None:
    full = worker_factory(queues=[_QUEUE], env={**own_env, "TOOLEXEC_TOOL_MODULES": _FULL})
    partial = worker_factory(queues=[_QUEUE], env={**own_env, "TOOLEXEC_TOOL_MODULES": _PARTIAL})
    assert full.info is not None and partial.info is not None
    extra = remote_tool("mixed_extra", client=own_client, timeout=10.0)

    served, refused = [], []
    for _ in range(_CALLS):
        try:
            served.append(extra.invoke_sync({}))
        except ToolNotFound as exc:
            refused.append(exc)
    same = same_tools_check({**own_env, "TOOLEXEC_TOOL_MODULES": _FULL})

    assert served and refused, (len(served), len(refused))
    assert set(served) <= set(full.child_pids())
    message = str(refused[0])
    assert f"registered on worker {partial.info.hostname}," in message
    assert "other live workers serve it on its queue" in message and "toolexec doctor" in message
    assert not same["ok"] and same["fix"]
    assert f"{partial.info.worker_id} consumes 'mixed' without mixed_extra" in same["message"]
    assert full.info.worker_id not in same["message"]


def test_the_doctor_passes_when_every_worker_of_a_queue_serves_the_same_tools(
    worker_factory: WorkerFactory, own_env: dict[str, str]
) -> None:
    env = {**own_env, "TOOLEXEC_TOOL_MODULES": _FULL}
    worker_factory(queues=[_QUEUE], env=env)
    worker_factory(queues=[_QUEUE], env=env)

    same = same_tools_check(env)

    assert same["ok"], same["message"]
    assert "2 live worker(s)" in same["message"] and "mixed" in same["message"]
