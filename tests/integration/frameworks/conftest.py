"""One real worker for the framework adapter tests, serving every tool they call.

Tools: the starter catalogue (``tasks``), ``examples.my_tools``, the agent probes
(``tests.integration.agent_tools``: ``call_context``), the test probes
(``tests.integration.probe_tools``: ``probe_echo``, ``probe_sleep``, ``probe_fail``...),
the idempotent counters (``tests.integration.idem_tools``: ``idem_count`` counts
its executions under a Redis key the test picks, so "ran once" is a number to read)
``own_deadline`` (``deadline_tools``: ``call_context`` with ``@tool(timeout=7)``), and
``approved_count`` (``@tool(requires_approval=True)``, counting its executions) and
``progress_steps`` (reports progress) from ``native_tools``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from agent_client import ToolClient, configure
from tests.integration.workers import module_worker
from toolexec import WorkerProcess
from wire.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
FRAMEWORK_TOOL_MODULES = (
    "tasks,examples.my_tools,tests.integration.agent_tools,tests.integration.probe_tools,"
    "tests.integration.idem_tools,tests.integration.frameworks.deadline_tools,"
    "tests.integration.frameworks.native_tools"
)
QUEUES = ("default", "payments", "idem", "slow", "single")


@pytest.fixture(scope="session")
def framework_env(settings_env: dict[str, str]) -> dict[str, str]:
    """The settings of the framework worker and of the agent process."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": FRAMEWORK_TOOL_MODULES}


@pytest.fixture(scope="module")
def framework_worker(
    framework_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A prefork worker (concurrency 4) serving every queue the framework tests use.

    Per module: other modules run workers of their own on ``default`` with other tools.
    """
    with module_worker(
        tmp_path_factory, "frameworks", env=framework_env, concurrency=4, queues=QUEUES
    ) as worker:
        yield worker


@pytest.fixture
def framework_client(
    framework_env: dict[str, str], framework_worker: WorkerProcess
) -> Iterator[ToolClient]:
    """This process's agent client, pointed at the framework worker's Redis."""
    client = configure(Settings.from_env(framework_env))
    yield client
    client.close()


@pytest.fixture
def runs(redis_server: object) -> Iterator[tuple[str, redis.Redis]]:
    """A fresh counter key for ``idem_count`` and a Redis client to read it with."""
    url = getattr(redis_server, "url")  # noqa: B009 - typed as object to keep the import light
    with redis.Redis.from_url(url) as client:
        yield f"counter-{uuid.uuid4().hex}", client


@pytest.fixture(scope="module")
def observe_worker(
    settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker that alone serves the ``observe`` tools (they report progress), per module."""
    env = {**settings_env, "TOOLEXEC_TOOL_MODULES": "tests.integration.observe_tools"}
    with module_worker(tmp_path_factory, "observe", env=env, queues=("observe",)) as worker:
        yield worker
