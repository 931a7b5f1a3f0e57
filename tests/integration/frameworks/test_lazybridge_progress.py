"""A remote tool's progress reaches a real LazyBridge ``Session`` as events of the call.

The agent is a real ``lazybridge.Agent`` driven by ``ScriptedProvider``; the tool
reports progress on a real worker that alone serves the ``observe`` queue
(``tests/integration/observe_tools.py``). What the session saw is read back from its
own ``EventLog`` and from a ``CallbackExporter``, as a LazyBridge user would.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from lazybridge import CallbackExporter, LLMEngine, Session

from agent_client import ToolClient, configure, remote_tool
from agent_client.frameworks import lazybridge as lazybridge_adapter
from agent_client.frameworks.lazybridge import TOOL_PROGRESS
from agent_client.testing import ScriptedProvider, scripted_agent
from toolexec import WorkerProcess
from wire.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def client(settings_env: dict[str, str], observe_worker: WorkerProcess) -> Iterator[ToolClient]:
    """This process's agent client, on the observe worker's Redis."""
    client = configure(Settings.from_env(settings_env))
    yield client
    client.close()


def test_each_progress_report_is_a_session_event_between_the_calls_tool_call_and_tool_result(
    client: ToolClient,
) -> None:
    exported: list[dict[str, Any]] = []
    session = Session(exporters=[CallbackExporter(fn=exported.append)])
    provider = ScriptedProvider([[("observe_steps", {"steps": 5, "pause": 0.15})], "done"])
    agent = scripted_agent(
        [remote_tool("observe_steps")], provider, session=session, name="watcher"
    )

    assert agent("go").text() == "done"

    events = session.events.query()
    kinds = [event["event_type"] for event in events]
    call, result = kinds.index("tool_call"), kinds.index("tool_result")
    progress = [event for event in events if event["event_type"] == TOOL_PROGRESS]
    assert progress, kinds
    assert all(call < events.index(event) < result for event in progress)
    assert {event["run_id"] for event in progress} == {events[call]["run_id"]}
    done = [event["payload"]["done"] for event in progress]
    assert done == sorted(done)  # in order; the worker may skip some under 100 ms apart
    assert progress[-1]["payload"] == {
        "agent_name": "watcher",
        "tool": "observe_steps",
        "tool_use_id": "call_0_0",  # the id LazyBridge's tool_call event carries
        "done": 5,
        "total": 5,
        "message": "step 5",
    }
    assert [e["payload"] for e in progress] == [
        {k: v for k, v in e.items() if k not in ("event_type", "session_id", "run_id")}
        for e in exported
        if e["event_type"] == TOOL_PROGRESS
    ]


def test_an_agent_without_a_session_asks_for_no_progress(
    client: ToolClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []
    call = client.call

    async def recording(*args: Any, **options: Any) -> Any:
        asked.append("progress" in options)
        return await call(*args, **options)

    monkeypatch.setattr(client, "call", recording)
    tool = remote_tool("observe_steps")
    for session in (None, Session()):
        provider = ScriptedProvider([[("observe_steps", {"steps": 2})], "done"])
        assert scripted_agent([tool], provider, session=session)("go").text() == "done"

    assert asked == [False, True]


def test_lazybridge_hands_its_tool_calls_session_and_run_to_the_wrapped_exec_tool() -> None:
    # Pins the private seam: LLMEngine._exec_tool(tc, tool_map, *, agent_name, session,
    # run_id, ...), wrapped once, however often the adapter asks.
    wrapped = LLMEngine._exec_tool

    lazybridge_adapter.record_tool_calls()

    assert LLMEngine._exec_tool is wrapped
    original = getattr(wrapped, "__wrapped__")  # noqa: B009 - set by functools.wraps
    assert not hasattr(original, "__wrapped__") and original.__module__ == "lazybridge.engines.llm"
    parameters = inspect.signature(original).parameters
    assert list(parameters)[:3] == ["self", "tc", "tool_map"]
    assert {"agent_name", "session", "run_id"} <= {
        name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
