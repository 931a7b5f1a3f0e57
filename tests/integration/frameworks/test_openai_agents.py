"""A real openai-agents Agent, driven by the SDK's own ScriptedModel, calling tools on a
real worker.

The model is ``agents.testing.ScriptedModel``, which the SDK ships as its deterministic
implementation of its ``Model`` interface; nothing reaches OpenAI: no API key is used
and traces go to an in-memory processor. Each promise is checked for a single
``remote_tool(...).as_openai_agents()`` and for ``remote_tools().as_openai_agents()``:
validation in the proxy, deadline precedence, the run as toolexec's run, and errors
shown to the model as text.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    Runner,
    RunResult,
    ToolCallOutputItem,
    TracingProcessor,
    set_trace_processors,
    set_tracing_disabled,
    trace,
)
from agents.exceptions import ToolTimeoutError as SDKToolTimeoutError
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import CustomSpanData, Span, Trace
from agents.tracing.processors import default_processor

from agent_client import ToolClient, remote_tool, remote_tools, run_scope
from agent_client.frameworks.openai_agents import TOOL_PROGRESS, strict_parameters
from agent_client.remote import RemoteTool
from tests.integration.deadlines import as_set
from tests.integration.frameworks.examples import assert_example_prints_its_docstring
from tests.integration.polling import wait_until
from toolexec import WorkerProcess
from wire.models import ToolSpec

KINDS = ("remote_tool", "remote_tools")
Runs = tuple[str, redis.Redis]
Turn = list[tuple[str, dict[str, Any] | str]]


class TraceIds(TracingProcessor):
    """Records the id of every trace started, and every span ended; exports nothing (no network)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.spans: list[Span[Any]] = []

    def on_trace_start(self, trace: Trace) -> None:
        self.ids.append(trace.trace_id)

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def on_span_end(self, span: Span[Any]) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


@pytest.fixture(scope="module")
def traces() -> Iterator[TraceIds]:
    """Traces stay in this process for the module; the SDK's exporter is put back after."""
    recorder = TraceIds()
    set_trace_processors([recorder])
    yield recorder
    set_trace_processors([default_processor()])


@pytest.fixture(autouse=True)
def _client(framework_client: ToolClient, traces: TraceIds) -> ToolClient:
    return framework_client


@pytest.fixture
def tracing_disabled() -> Iterator[None]:
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def agent_tools(kind: str, names: list[str], timeout: float | None = None) -> list[FunctionTool]:
    """``names`` as single proxies with ``timeout``, or the catalogue with it as its default."""
    if kind == "remote_tool":
        if timeout is None:
            return [remote_tool(name).as_openai_agents() for name in names]
        return [remote_tool(name, timeout=timeout).as_openai_agents() for name in names]
    toolset = remote_tools() if timeout is None else remote_tools(default_timeout=timeout)
    assert set(names) <= set(toolset.names)
    tools: list[FunctionTool] = toolset.as_openai_agents()
    return tools


def named(tools: list[FunctionTool], name: str) -> FunctionTool:
    (tool,) = [t for t in tools if t.name == name]
    return tool


def run_agent(
    tools: list[FunctionTool], turns: list[Turn], **options: Any
) -> tuple[RunResult, list[str]]:
    """One ``Runner.run`` of a scripted model; its result and the tool outputs the model was shown.

    Each turn is the tool calls of one model response (several run concurrently).
    """
    steps = [
        [
            function_call(name, arguments, call_id=f"c{i}.{j}")
            for j, (name, arguments) in enumerate(turn)
        ]
        for i, turn in enumerate(turns)
    ]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    agent = Agent(name="tester", model=model, tools=[*tools])
    result = asyncio.run(Runner.run(agent, "go", **options))
    model.assert_complete()
    assert result.final_output == "done"
    shown = [str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    return result, shown


@pytest.mark.parametrize("kind", KINDS)
def test_as_openai_agents_gives_strict_function_tools_whose_invokers_are_async(kind: str) -> None:
    tools = agent_tools(kind, ["search"])

    assert tools and all(isinstance(t, FunctionTool) for t in tools)
    assert all(inspect.iscoroutinefunction(t.on_invoke_tool) for t in tools)
    search = named(tools, "search")
    assert search.strict_json_schema is True
    assert search.params_json_schema["required"] == ["query", "limit"]
    assert {"type": "null"} in search.params_json_schema["properties"]["limit"]["anyOf"]
    assert search.timeout_seconds is None  # toolexec's deadline is the one timer


@pytest.mark.parametrize("kind", KINDS)
def test_an_agent_calls_a_remote_tool_and_sees_its_result(kind: str) -> None:
    _, (shown,) = run_agent(
        agent_tools(kind, ["search"]), [[("search", {"query": "red-headed league", "limit": 1})]]
    )

    assert json.loads(shown)[0]["source"] == "the-red-headed-league.txt"


# -- 1. validation in the proxy -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_call_is_refused_before_sending_and_the_model_reads_which_field(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    tools = agent_tools(kind, ["idem_count", "book_flight"])

    _, shown = run_agent(
        tools,
        [
            [("idem_count", {"counter": counter, "seconds": "long"})],
            [("book_flight", {"flight_id": "tomorrow", "passenger": "Ada"})],
        ],
    )

    count_error, booking_error = shown
    assert count_error.startswith(
        "[INVALID_ARGUMENTS] invalid arguments for tool 'idem_count': seconds:"
    )
    assert booking_error.startswith(
        "[INVALID_ARGUMENTS] invalid arguments for tool 'book_flight': flight_id:"
    )
    assert client.get(counter) is None  # nothing reached a worker


@pytest.mark.parametrize("kind", KINDS)
def test_arguments_that_are_not_a_json_object_are_invalid_arguments_and_the_run_goes_on(
    kind: str,
) -> None:
    _, (not_json, not_object) = run_agent(
        agent_tools(kind, ["search"]), [[("search", "{'query': 'fox'")], [("search", "[1, 2]")]]
    )

    assert not_json.startswith(
        "[INVALID_ARGUMENTS] arguments for tool 'search' are not JSON (Expecting"
    )
    assert not_json.endswith("; send one JSON object")
    assert not_object == (
        "[INVALID_ARGUMENTS] invalid arguments for tool 'search': arguments must be an object, got "
        "list"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_null_for_an_optional_parameter_means_its_default_and_null_for_a_required_one_is_refused(
    kind: str,
) -> None:
    tools = agent_tools(kind, ["probe_echo"])

    _, (defaults, refused) = run_agent(
        tools,
        [
            [("probe_echo", {"text": "hi", "number": 1, "ratio": None, "flags": None})],
            [("probe_echo", {"text": None, "number": 1, "ratio": None, "flags": None})],
        ],
    )

    echoed = json.loads(defaults)
    assert (echoed["ratio"], echoed["flags"]) == (0.5, None)
    assert refused == (
        "[INVALID_ARGUMENTS] invalid arguments for tool 'probe_echo': text: None is not of type "
        "'string'"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_with_nulls_for_optional_parameters_is_the_same_call_as_one_without_them(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    nulls = {"seconds": None, "ratio": None, "seat": None, "marker": None}

    _, shown = run_agent(
        agent_tools(kind, ["idem_count"]),
        [[("idem_count", {"counter": counter})], [("idem_count", {"counter": counter, **nulls})]],
    )

    without, with_nulls = (json.loads(s) for s in shown)
    assert with_nulls["token"] == without["token"] and with_nulls["runs"] == 1
    assert int(client.get(counter) or 0) == 1


def test_a_schema_that_strict_mode_would_change_gives_a_non_strict_tool() -> None:
    open_object = {
        "type": "object",
        "properties": {"counts": {"type": "object", "additionalProperties": {"type": "integer"}}},
        "required": ["counts"],
    }
    nested_optional_without_default = {
        "type": "object",
        "properties": {"seat": {"type": "object", "properties": {"row": {"type": "integer"}}}},
        "required": ["seat"],
    }
    for parameters in (open_object, nested_optional_without_default):
        tool = RemoteTool(
            ToolSpec(name="t", description="T.", parameters=copy.deepcopy(parameters))
        )

        function_tool = tool.as_openai_agents()

        assert function_tool.strict_json_schema is False
        assert function_tool.params_json_schema == parameters


def test_null_stays_a_value_where_the_schema_allows_it_and_the_default_is_not_null() -> None:
    nullable = {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 3}
    schema = {
        "type": "object",
        "properties": {"n": nullable, "m": {"type": "integer", "default": 1}},
    }

    strict, nulls_mean_default = strict_parameters(schema)

    assert strict is not None and strict["required"] == ["n", "m"]
    assert nulls_mean_default == frozenset({"m"})
    assert (
        strict_parameters({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}})[0]
        is None
    )


# -- 2. deadline precedence ---------------------------------------------------------------


def time_left(tools: list[FunctionTool]) -> float:
    _, (shown,) = run_agent(tools, [[("call_context", {})]])
    return float(json.loads(shown)["time_left"])


@pytest.mark.parametrize("kind", KINDS)
def test_the_proxy_or_toolset_deadline_reaches_the_worker(kind: str) -> None:
    assert as_set(time_left(agent_tools(kind, ["call_context"], timeout=9.0)), 9.0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_function_tools_timeout_seconds_is_the_framework_level(kind: str) -> None:
    tools = agent_tools(kind, ["call_context"], timeout=None if kind == "remote_tool" else 9.0)
    named(tools, "call_context").timeout_seconds = 4.0  # the SDK's one tool-timeout setting

    assert as_set(time_left(tools), 4.0)  # over the 60 s settings and the toolset's 9 s


def test_a_timeout_given_to_remote_tool_wins_over_the_function_tools_timeout_seconds() -> None:
    tool = remote_tool("call_context", timeout=9.0).as_openai_agents()
    tool.timeout_seconds = 12.0

    assert as_set(time_left([tool]), 9.0)


@pytest.mark.parametrize("kind", KINDS)
def test_with_no_deadline_set_anywhere_the_settings_default_applies(kind: str) -> None:
    assert as_set(time_left(agent_tools(kind, ["call_context"])), 60.0)


def own_deadline_left(tools: list[FunctionTool]) -> float:
    _, (shown,) = run_agent(tools, [[("own_deadline", {})]])
    return float(json.loads(shown)["time_left"])


@pytest.mark.parametrize("kind", KINDS)
def test_with_nothing_above_it_set_the_tools_own_timeout_applies(kind: str) -> None:
    assert as_set(own_deadline_left(agent_tools(kind, ["own_deadline"])), 7.0)  # @tool(timeout=7)


def test_remote_tools_default_timeout_wins_over_the_tools_own_and_timeout_seconds_over_both() -> (
    None
):
    tools = agent_tools("remote_tools", ["own_deadline"], timeout=9.0)
    assert as_set(own_deadline_left(tools), 9.0)

    named(tools, "own_deadline").timeout_seconds = 12.0  # the framework level, longer
    assert as_set(own_deadline_left(tools), 12.0)


# -- 3. the SDK's run is toolexec's run ------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_worker_sees_the_runs_trace_id_as_its_run_id(kind: str, traces: TraceIds) -> None:
    _, (shown,) = run_agent(agent_tools(kind, ["call_context"]), [[("call_context", {})]])

    assert json.loads(shown)["run_id"] == traces.ids[-1]
    assert traces.ids[-1].startswith("trace_")


def check_one_execution_per_run(
    tools: list[FunctionTool], counter: str, client: redis.Redis, **options: Any
) -> None:
    """Two calls in one response and one in the next share an execution; a new run does not."""
    call = ("idem_count", {"counter": counter, "seconds": 0.3})

    _, first_run = run_agent(tools, [[call, call], [call]], **options)
    _, second_run = run_agent(tools, [[call]], **options)

    first = [json.loads(s) for s in first_run]
    (second,) = (json.loads(s) for s in second_run)
    assert len(first) == 3 and {r["token"] for r in first} == {first[0]["token"]}
    assert first[0]["runs"] == 1 and second["runs"] == 2
    assert first[0]["run_id"] != second["run_id"]
    assert "no-op" not in (first[0]["run_id"], second["run_id"])
    assert int(client.get(counter) or 0) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_repeats_within_one_run_share_one_execution_and_two_runs_do_not(
    kind: str, runs: Runs
) -> None:
    check_one_execution_per_run(agent_tools(kind, ["idem_count"]), *runs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.usefixtures("tracing_disabled")
def test_with_tracing_disabled_globally_runs_are_still_told_apart(kind: str, runs: Runs) -> None:
    check_one_execution_per_run(agent_tools(kind, ["idem_count"]), *runs)


@pytest.mark.parametrize("kind", KINDS)
def test_with_tracing_disabled_for_the_run_runs_are_still_told_apart(kind: str, runs: Runs) -> None:
    tools = agent_tools(kind, ["idem_count"])

    check_one_execution_per_run(tools, *runs, run_config=RunConfig(tracing_disabled=True))


@dataclass
class AppContext:
    user: str
    run_id: str


@dataclass
class ToolexecContext:
    user: str
    toolexec_run_id: str
    run_id: str = "the-apps-own-id"  # toolexec_run_id wins over it


@pytest.mark.parametrize(
    "context",
    [
        {"run_id": "order-42"},
        {"toolexec_run_id": "order-42"},
        AppContext(user="ada", run_id="order-42"),
        ToolexecContext(user="ada", toolexec_run_id="order-42"),
    ],
)
def test_a_run_id_in_the_run_context_names_the_run_even_across_runner_runs(
    context: object, runs: Runs
) -> None:
    counter, client = runs
    tools = agent_tools("remote_tool", ["idem_count"])
    call = ("idem_count", {"counter": counter})

    _, (first,) = run_agent(tools, [[call]], context=context)
    _, (second,) = run_agent(tools, [[call]], context=context)

    assert json.loads(first)["run_id"] == "order-42"
    assert json.loads(second)["token"] == json.loads(first)["token"]
    assert int(client.get(counter) or 0) == 1


def test_runs_inside_one_open_trace_are_one_run(runs: Runs) -> None:
    counter, client = runs
    tools = agent_tools("remote_tool", ["idem_count"])
    call = ("idem_count", {"counter": counter})

    with trace("booking workflow") as workflow:
        _, (first,) = run_agent(tools, [[call]])
        _, (second,) = run_agent(tools, [[call]])

    assert json.loads(first)["run_id"] == workflow.trace_id
    assert json.loads(second)["token"] == json.loads(first)["token"]
    assert int(client.get(counter) or 0) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_an_enclosing_run_scope_wins_over_the_trace_so_two_runner_runs_share_one_run(
    kind: str, runs: Runs
) -> None:
    counter, client = runs
    tools = agent_tools(kind, ["idem_count"])
    call = ("idem_count", {"counter": counter})

    with run_scope("scope-7"):
        _, (first,) = run_agent(tools, [[call]])
        _, (second,) = run_agent(tools, [[call]])

    assert json.loads(first)["run_id"] == json.loads(second)["run_id"] == "scope-7"
    assert json.loads(second)["token"] == json.loads(first)["token"]
    assert int(client.get(counter) or 0) == 1


# -- 4. timeouts and tool errors as text for the model ---------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_is_text_for_the_model_the_run_goes_on_and_no_thread_is_left(kind: str) -> None:
    tools = agent_tools(kind, ["probe_sleep"], timeout=0.5)
    run_agent(tools, [[("probe_sleep", {"seconds": 0.01})]])  # the client's listener is up
    threads = threading.active_count()

    started = time.monotonic()
    _, shown = run_agent(tools, [[("probe_sleep", {"seconds": 5})]])
    elapsed = time.monotonic() - started

    assert shown == ["[TOOL_TIMEOUT] Tool 'probe_sleep' timed out after 0.5s"]
    assert elapsed < 5.0  # answered before the 5 s tool could have finished
    assert wait_until(lambda: threading.active_count() <= threads, timeout=5), threading.enumerate()


def test_the_sdks_own_timeout_reads_the_same_and_leaves_no_thread() -> None:
    tool = remote_tool("probe_sleep", timeout=None).as_openai_agents()  # toolexec: no deadline
    tool.timeout_seconds = 0.5  # the SDK cancels the call itself
    run_agent([tool], [[("probe_sleep", {"seconds": 0.01})]])
    threads = threading.active_count()

    started = time.monotonic()
    _, shown = run_agent([tool], [[("probe_sleep", {"seconds": 2})]])
    elapsed = time.monotonic() - started

    assert shown == ["[TOOL_TIMEOUT] Tool 'probe_sleep' timed out after 0.5s"]
    assert elapsed < 2.0  # answered before the 2 s tool could have finished
    assert wait_until(lambda: threading.active_count() <= threads, timeout=5), threading.enumerate()


@pytest.mark.parametrize("kind", KINDS)
def test_a_remote_failure_is_text_naming_its_type_and_message_and_the_run_goes_on(
    kind: str,
) -> None:
    _, shown = run_agent(
        agent_tools(kind, ["probe_fail", "search"]),
        [
            [("probe_fail", {"message": "no ink left"})],
            [("search", {"query": "!!!", "limit": None})],
        ],
    )

    failed, search_failed = shown
    assert failed == "[TOOL_ERROR] tool 'probe_fail' failed: ProbeFailure: no ink left"
    assert search_failed.startswith("[TOOL_ERROR] tool 'search' failed: ValueError:")


def test_a_timeout_fails_the_run_with_the_sdks_error_when_the_tool_says_raise_exception() -> None:
    tool = remote_tool("probe_sleep", timeout=0.3).as_openai_agents()
    tool.timeout_behavior = "raise_exception"

    with pytest.raises(SDKToolTimeoutError) as raised:
        run_agent([tool], [[("probe_sleep", {"seconds": 2})]])

    assert (raised.value.tool_name, raised.value.timeout_seconds) == ("probe_sleep", 0.3)


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_is_shown_as_the_tools_timeout_error_function_words_it(kind: str) -> None:
    tool = named(agent_tools(kind, ["probe_sleep"], timeout=0.3), "probe_sleep")
    seen: list[tuple[str, float]] = []

    async def worded(ctx: Any, error: Exception) -> str:
        assert isinstance(error, SDKToolTimeoutError)
        seen.append((error.tool_name, error.timeout_seconds))
        return f"{error.tool_name} is slow today"

    tool.timeout_error_function = worded
    _, custom = run_agent([tool], [[("probe_sleep", {"seconds": 2})]])
    tool.timeout_error_function = None
    _, default = run_agent([tool], [[("probe_sleep", {"seconds": 2})]])

    assert custom == ["probe_sleep is slow today"] and seen == [("probe_sleep", 0.3)]
    assert default == ["Tool 'probe_sleep' timed out after 0.3 seconds."]  # the SDK's own text


# -- 5. approval, as the SDK asks for it --------------------------------------------------------


def paused_run(tools: list[FunctionTool], counter: str) -> tuple[Agent[Any], RunResult]:
    """A run whose model calls ``approved_count`` once, stopped for its approval."""
    model = ScriptedModel(
        [
            [function_call("approved_count", {"counter": counter}, call_id="c1")],
            [assistant_message("done")],
        ]
    )
    agent = Agent(name="tester", model=model, tools=[*tools])
    return agent, asyncio.run(Runner.run(agent, "go"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("verdict", ["approve", "reject"])
def test_an_approved_call_is_sent_once_and_a_rejected_one_never(
    kind: str, verdict: str, runs: Runs
) -> None:
    counter, client = runs
    agent, paused = paused_run(agent_tools(kind, ["approved_count"]), counter)

    (item,) = paused.interruptions
    assert item.raw_item.name == "approved_count"  # type: ignore[union-attr]
    assert client.get(counter) is None  # nothing is sent before the decision
    state = paused.to_state()
    getattr(state, verdict)(item)
    result = asyncio.run(Runner.run(agent, state))

    (shown,) = [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert result.final_output == "done"
    if verdict == "approve":
        assert json.loads(shown) == {"runs": 1} and int(client.get(counter) or 0) == 1
    else:
        assert shown == "Tool execution was not approved." and client.get(counter) is None


def test_a_proxy_override_makes_a_tool_wait_for_approval_or_run_without_it(runs: Runs) -> None:
    counter, client = runs
    trusted = remote_tool("approved_count", requires_approval=False).as_openai_agents()
    gated = remote_tool("search", requires_approval=True).as_openai_agents()

    _, shown = run_agent([trusted], [[("approved_count", {"counter": counter})]])

    assert json.loads(shown[0]) == {"runs": 1} and int(client.get(counter) or 0) == 1
    assert (trusted.needs_approval, gated.needs_approval) == (False, True)


# -- 6. progress, in the SDK's traces ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_progress_report_of_a_traced_run_is_a_custom_span_of_its_call(
    kind: str, traces: TraceIds
) -> None:
    traces.spans.clear()

    run_agent(
        agent_tools(kind, ["progress_steps"]), [[("progress_steps", {"steps": 3, "pause": 0.15})]]
    )

    progress = [
        s
        for s in traces.spans
        if isinstance(s.span_data, CustomSpanData) and s.span_data.name == TOOL_PROGRESS
    ]
    assert progress, "no progress span was recorded"
    function = {s.span_id for s in traces.spans if s.span_data.type == "function"}
    assert {s.parent_id for s in progress} <= function and len({s.parent_id for s in progress}) == 1
    data = [s.span_data.data for s in progress]  # type: ignore[attr-defined]
    assert {(d["tool"], d["call_id"], d["total"]) for d in data} == {("progress_steps", "c0.0", 3)}
    assert (data[-1]["done"], data[-1]["message"]) == (
        3,
        "step 3",
    )  # the last report always arrives


@pytest.mark.usefixtures("tracing_disabled")
def test_an_untraced_run_records_no_progress_and_still_gets_the_result(traces: TraceIds) -> None:
    traces.spans.clear()

    _, (shown,) = run_agent(
        agent_tools("remote_tool", ["progress_steps"]), [[("progress_steps", {"steps": 2})]]
    )

    assert json.loads(shown) == {"steps": 2}
    assert traces.spans == []


# -- the example ------------------------------------------------------------------------------


def test_the_openai_agents_example_prints_what_its_docstring_says(
    framework_env: dict[str, str], framework_worker: WorkerProcess
) -> None:
    assert_example_prints_its_docstring(
        "openai_agents_agent.py",
        framework_env,
        timeout=120,
        without=["OPENAI_API_KEY"],  # none needed
    )
