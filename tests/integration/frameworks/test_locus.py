"""A real locus Agent, driven by locus's own ScriptedModel, calling tools on a real worker.

Each promise is checked for a single ``remote_tool(...).as_locus()`` and for the whole
``remote_tools().as_locus()``: validation in the proxy, deadline precedence, locus's
run id as toolexec's run, and errors shown the way locus shows a raising tool.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from typing import Any

import pytest
import redis
from locus.agent.agent import Agent
from locus.agent.result import AgentResult
from locus.control import InMemoryApprovals
from locus.core.events import InterruptEvent, LocusEvent, ToolCompleteEvent, ToolProgressEvent
from locus.core.messages import Message, ToolCall
from locus.hooks.provider import BeforeToolCallEvent, HookPriority, HookProvider
from locus.models.base import ModelResponse
from locus.testing import ScriptedModel, text, tool_call
from locus.tools.decorator import Tool

from agent_client import ToolClient, remote_tool, remote_tools, run_scope
from agent_client.frameworks.locus import CALL_TIMEOUT
from tests.integration.deadlines import as_set
from tests.integration.frameworks.examples import assert_example_prints_its_docstring
from tests.integration.polling import wait_until
from toolexec import WorkerProcess

KINDS = ("remote_tool", "remote_tools")
Runs = tuple[str, redis.Redis]


class CallDeadlines(HookProvider):
    """A locus hook giving each successive tool call its own deadline (the call level)."""

    def __init__(self, *seconds: float) -> None:
        self._seconds = list(seconds)

    @property
    def priority(self) -> int:
        return int(HookPriority.DEFAULT)

    async def on_before_tool_call(self, event: BeforeToolCallEvent) -> None:
        event.secret_arguments = {CALL_TIMEOUT: self._seconds.pop(0)}


def locus_tools(
    kind: str,
    names: list[str],
    timeout: float | None = None,
    approvals: InMemoryApprovals | None = None,
) -> list[Any]:
    """``names`` as single proxies with ``timeout``, or the catalogue with it as its default.

    The catalogue holds a tool that requires approval, so it records decisions in
    ``approvals`` (a fresh store if none is given).
    """
    if kind == "remote_tool":
        if timeout is None:
            return [remote_tool(name).as_locus(approvals=approvals) for name in names]
        return [remote_tool(name, timeout=timeout).as_locus(approvals=approvals) for name in names]
    toolset = remote_tools() if timeout is None else remote_tools(default_timeout=timeout)
    assert set(names) <= set(toolset.names)
    return toolset.as_locus(approvals=approvals if approvals is not None else InMemoryApprovals())


def run_agent(
    tools: list[Any], turns: list[ModelResponse], **options: Any
) -> tuple[AgentResult, list[str]]:
    """Run a locus Agent on ``turns``; its result and the tool results the model was shown."""
    agent = Agent(
        model=ScriptedModel([*turns, text("done")]), tools=tools, context_window=32_000, **options
    )
    result = asyncio.run(agent.arun("go"))
    assert result.message == "done"
    shown = [str(m.content) for m in result.state.messages if m.role == "tool"]
    return result, shown


@pytest.fixture(autouse=True)
def _client(framework_client: ToolClient) -> ToolClient:
    return framework_client


@pytest.mark.parametrize("kind", KINDS)
def test_as_locus_gives_real_locus_tools_whose_functions_are_async(kind: str) -> None:
    tools = locus_tools(kind, ["search"])

    assert tools and all(isinstance(t, Tool) for t in tools)
    assert all(inspect.iscoroutinefunction(t.fn) for t in tools)
    (search,) = [t for t in tools if t.name == "search"]
    assert search.parameters == remote_tool("search").parameters


# -- 1. validation in the proxy -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_call_is_refused_before_sending_and_the_model_reads_which_field(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    tools = locus_tools(kind, ["idem_count", "book_flight"])

    _, shown = run_agent(
        tools,
        [
            tool_call("idem_count", call_id="c1", counter=counter, seconds="long"),
            tool_call("book_flight", call_id="c2", flight_id="tomorrow", passenger="Ada"),
        ],
    )

    count_error, booking_error = shown
    assert count_error.startswith(
        "Error: ToolArgumentsInvalid: invalid arguments for tool 'idem_count': seconds:"
    )
    assert booking_error.startswith(
        "Error: ToolArgumentsInvalid: invalid arguments for tool 'book_flight': flight_id:"
    )
    assert client.get(counter) is None  # nothing reached a worker


# -- 2. deadline precedence ---------------------------------------------------------------


def time_left(tools: list[Any], **options: Any) -> float:
    _, (shown,) = run_agent(tools, [tool_call("call_context")], **options)
    return float(json.loads(shown)["time_left"])


@pytest.mark.parametrize("kind", KINDS)
def test_the_proxy_or_toolset_deadline_reaches_the_worker(kind: str) -> None:
    assert as_set(time_left(locus_tools(kind, ["call_context"], timeout=9.0)), 9.0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_deadline_a_hook_gives_one_call_wins_over_the_proxy_and_toolset_deadline(
    kind: str,
) -> None:
    tools = locus_tools(kind, ["call_context"], timeout=9.0)

    assert as_set(time_left(tools, hooks=[CallDeadlines(3.0)]), 3.0)


@pytest.mark.parametrize("kind", KINDS)
def test_with_no_deadline_set_anywhere_the_settings_default_applies(kind: str) -> None:
    # locus has no default tool timeout, so nothing sits between the proxy and settings.
    assert as_set(time_left(locus_tools(kind, ["call_context"])), 60.0)


def own_deadline_left(tools: list[Any]) -> float:
    _, (shown,) = run_agent(tools, [tool_call("own_deadline")])
    return float(json.loads(shown)["time_left"])


@pytest.mark.parametrize("kind", KINDS)
def test_with_nothing_above_it_set_the_tools_own_timeout_applies(kind: str) -> None:
    assert as_set(own_deadline_left(locus_tools(kind, ["own_deadline"])), 7.0)  # @tool(timeout=7)


def test_remote_tools_default_timeout_wins_over_the_tools_own() -> None:
    assert (
        8.0 < own_deadline_left(locus_tools("remote_tools", ["own_deadline"], timeout=9.0)) <= 9.0
    )


# -- 3. locus's run id is toolexec's run ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_worker_sees_the_locus_run_id(kind: str) -> None:
    result, (shown,) = run_agent(locus_tools(kind, ["call_context"]), [tool_call("call_context")])

    assert json.loads(shown)["run_id"] == result.state.run_id


@pytest.mark.parametrize("kind", KINDS)
def test_repeats_within_one_locus_run_share_one_execution_and_two_runs_do_not(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    tools = locus_tools(kind, ["idem_count"])
    repeat = [tool_call("idem_count", call_id=f"c{i}", counter=counter) for i in range(3)]

    _, first_run = run_agent(tools, repeat)
    _, second_run = run_agent(tools, repeat[:1])

    first = [json.loads(shown) for shown in first_run]
    assert {r["token"] for r in first} == {first[0]["token"]} and first[0]["runs"] == 1
    assert json.loads(second_run[0])["runs"] == 2
    assert int(client.get(counter) or 0) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_an_enclosing_run_scope_wins_so_two_locus_runs_inside_it_share_one_run(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    tools = locus_tools(kind, ["idem_count"])
    call = tool_call("idem_count", call_id="c1", counter=counter)

    with run_scope() as run_id:
        first, (one,) = run_agent(tools, [call])
        second, (two,) = run_agent(tools, [call])

    assert first.state.run_id != second.state.run_id  # two locus runs
    assert json.loads(one)["run_id"] == json.loads(two)["run_id"] == run_id
    assert json.loads(two)["token"] == json.loads(one)["token"]
    assert int(client.get(counter) or 0) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_identical_calls_in_one_concurrent_batch_run_once(kind: str, runs: Runs) -> None:
    counter, client = runs
    calls = [
        ToolCall(id=f"c{i}", name="idem_count", arguments={"counter": counter, "seconds": 0.5})
        for i in range(3)
    ]
    batch = ModelResponse(message=Message.assistant(tool_calls=calls), stop_reason="tool_calls")

    _, shown = run_agent(locus_tools(kind, ["idem_count"]), [batch], tool_execution="concurrent")

    assert len({json.loads(s)["token"] for s in shown}) == 1 and len(shown) == 3
    assert int(client.get(counter) or 0) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_after_a_timeout_joins_the_running_execution_instead_of_a_locus_cached_error(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    tools = locus_tools(kind, ["idem_count"])
    assert not any(t.idempotent for t in tools)  # locus's own result/error cache stays out
    same_call: dict[str, Any] = {"counter": counter, "seconds": 2.5}

    started = time.monotonic()
    _, (timed_out, retried) = run_agent(
        tools,
        [
            tool_call("idem_count", call_id="c1", **same_call),
            tool_call("idem_count", call_id="c2", **same_call),
        ],
        hooks=[CallDeadlines(0.5, 20.0)],  # the retry gets a longer deadline
    )
    elapsed = time.monotonic() - started

    assert timed_out == "Error: ToolTimeoutError: tool 'idem_count' timed out after 0.5s"
    assert retried.startswith("{"), retried  # not locus replaying the error
    assert json.loads(retried)["runs"] == 1
    assert int(client.get(counter) or 0) == 1
    assert elapsed < 5.0  # joined the first execution (2.5 s): two would take 5 s


# -- 4. timeouts and tool errors as locus shows them -----------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_is_a_locus_tool_error_the_run_goes_on_and_no_thread_is_left(kind: str) -> None:
    tools = locus_tools(kind, ["probe_sleep"], timeout=0.5)
    run_agent(tools, [tool_call("probe_sleep", seconds=0.01)])  # the client's listener is up
    threads = threading.active_count()

    started = time.monotonic()
    _, shown = run_agent(tools, [tool_call("probe_sleep", seconds=5)])
    elapsed = time.monotonic() - started

    assert shown == ["Error: ToolTimeoutError: tool 'probe_sleep' timed out after 0.5s"]
    assert elapsed < 5.0  # answered before the 5 s tool could have finished
    assert wait_until(lambda: threading.active_count() <= threads, timeout=5), threading.enumerate()


@pytest.mark.parametrize("kind", KINDS)
def test_a_remote_failure_shows_the_model_its_type_and_message(kind: str) -> None:
    _, shown = run_agent(
        locus_tools(kind, ["probe_fail"]), [tool_call("probe_fail", message="no ink left")]
    )

    assert shown == [
        "Error: ToolExecutionError: tool 'probe_fail' failed: ProbeFailure: no ink left"
    ]


# -- approval, as locus asks for it: its admission gate ----------------------------------------


async def events_of(stream: Any) -> list[LocusEvent]:
    return [event async for event in stream]


def paused_agent(kind: str, counter: str) -> tuple[Agent, InMemoryApprovals, InterruptEvent]:
    """An agent whose model calls ``approved_count`` once, and the interrupt its run paused on."""
    approvals = InMemoryApprovals()
    model = ScriptedModel(
        [tool_call("approved_count", call_id="c1", counter=counter), text("done")]
    )
    agent = Agent(
        model=model,
        tools=locus_tools(kind, ["approved_count"], approvals=approvals),
        context_window=32_000,
    )
    (pause,) = [e for e in asyncio.run(events_of(agent.run("go"))) if isinstance(e, InterruptEvent)]
    return agent, approvals, pause


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("verdict", ["approved", "denied"])
def test_a_held_call_is_sent_once_when_approved_and_never_when_denied(
    kind: str, verdict: str, runs: Runs
) -> None:
    counter, client = runs
    agent, approvals, pause = paused_agent(kind, counter)

    approval_id = pause.metadata["approval_id"]
    assert pause.metadata["arguments"] == {"counter": counter}
    assert client.get(counter) is None  # nothing is sent before the decision
    approvals.decide(approval_id, verdict, by="ada")  # type: ignore[arg-type]
    resumed = asyncio.run(events_of(agent.resume(verdict, perform_dangling=True)))

    (done,) = [
        e for e in resumed if isinstance(e, ToolCompleteEvent) and e.tool_name == "approved_count"
    ]
    if verdict == "approved":
        assert json.loads(done.result or "") == {"runs": 1} and int(client.get(counter) or 0) == 1
    else:
        assert json.loads(done.result or "")["status"] == "denied" and client.get(counter) is None


def test_a_tool_that_requires_approval_needs_a_store_for_the_decisions_unless_overridden(
    runs: Runs,
) -> None:
    counter, client = runs

    with pytest.raises(ValueError, match="requires approval: pass as_locus\\(approvals=...\\)"):
        remote_tool("approved_count").as_locus()
    with pytest.raises(ValueError, match="'approved_count' requires approval"):
        remote_tools().as_locus()
    trusted = remote_tools(requires_approval={"approved_count": False}).as_locus()
    _, shown = run_agent(
        [t for t in trusted if t.name == "approved_count"],
        [tool_call("approved_count", call_id="c1", counter=counter)],
    )

    assert [json.loads(s) for s in shown] == [{"runs": 1}] and int(client.get(counter) or 0) == 1


# -- progress, as locus streams it ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_progress_streams_live_as_locus_tool_progress_events_between_the_calls_start_and_end(
    kind: str,
) -> None:
    model = ScriptedModel(
        [tool_call("progress_steps", call_id="c1", steps=3, pause=0.15), text("done")]
    )
    agent = Agent(model=model, tools=locus_tools(kind, ["progress_steps"]), context_window=32_000)

    events = asyncio.run(events_of(agent.run("go")))

    progress = [e for e in events if isinstance(e, ToolProgressEvent)]
    assert progress, [type(e).__name__ for e in events]
    assert {(e.tool_name, e.tool_call_id, e.total) for e in progress} == {
        ("progress_steps", "c1", 3)
    }
    assert (progress[-1].progress, progress[-1].message) == (
        3,
        "step 3",
    )  # the last one always arrives
    complete = next(i for i, e in enumerate(events) if isinstance(e, ToolCompleteEvent))
    assert all(events.index(e) < complete for e in progress)


# -- the example ------------------------------------------------------------------------------


def test_the_locus_example_prints_what_its_docstring_says(
    framework_env: dict[str, str], framework_worker: WorkerProcess
) -> None:
    assert_example_prints_its_docstring("locus_agent.py", framework_env)
