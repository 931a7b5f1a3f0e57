"""A real pydantic-ai ``Agent`` whose tools run on a real worker.

The model is pydantic-ai's own ``FunctionModel``, driven by a script of exact tool
calls, so every test runs offline and says which calls the model made. Each promise is
checked for a single ``remote_tool(...).as_pydantic_ai()`` and for the whole catalogue
(``remote_tools().as_pydantic_ai()``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import redis
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
    ToolDenied,
)
from pydantic_ai.exceptions import UnexpectedModelBehavior
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.run import AgentRunResult
from pydantic_ai.toolsets import FunctionToolset

from agent_client import (
    BrokerUnavailable,
    RemoteTool,
    ToolClient,
    remote_tool,
    remote_tools,
    run_scope,
)
from agent_client.deadline import NOT_SET, Timeout
from agent_client.frameworks.pydantic_ai import MAX_RETRIES, RemoteToolProgress
from tests.integration.frameworks.examples import assert_example_prints_its_docstring
from tests.integration.polling import wait_until
from toolexec import WorkerProcess
from wire.settings import Settings

KINDS = ["remote_tool", "remote_tools"]


@pytest.fixture(autouse=True, scope="module")
def _run_sync_loop_closed() -> Iterator[None]:
    """Close the event loop ``Agent.run_sync`` leaves as this thread's current loop.

    pydantic-ai's ``run_sync`` runs on the thread's current loop and, when there is none,
    makes one, sets it current and keeps it for the next ``run_sync`` (pydantic-graph's
    ``get_event_loop``): pydantic-ai's, never closed by it. The next ``asyncio.run`` in
    this thread would replace it and leave it to the garbage collector, unclosed.
    """
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "no current event loop"
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:  # none set: nothing to close
            return
    asyncio.set_event_loop(None)
    loop.close()


#: One model turn: the tool calls it makes (run concurrently by pydantic-ai), or its final text.
Step = list[tuple[str, dict[str, Any]]] | str


def scripted(*steps: Step) -> FunctionModel:
    """pydantic-ai's FunctionModel answering turn ``n`` with ``steps[n]``."""

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        step = steps[sum(isinstance(m, ModelResponse) for m in messages)]
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(name, args) for name, args in step])

    return FunctionModel(respond)


def streamed(*steps: Step) -> FunctionModel:
    """:func:`scripted` as a streaming model, so a run can have an ``event_stream_handler``."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        step = steps[turn]
        if isinstance(step, str):
            yield step
            return
        calls: DeltaToolCalls = {
            i: DeltaToolCall(name, json.dumps(args), tool_call_id=f"call-{turn}-{i}")
            for i, (name, args) in enumerate(step)
        }
        yield calls

    return FunctionModel(stream_function=stream)


def tools(kind: str, name: str, *, timeout: Timeout = NOT_SET) -> list[Tool[Any]]:
    """``name`` as one proxy, or the whole catalogue with ``timeout`` as its default."""
    if kind == "remote_tool":
        return [remote_tool(name, timeout=timeout).as_pydantic_ai()]
    catalogue: list[Tool[Any]] = remote_tools(default_timeout=timeout).as_pydantic_ai()
    assert name in {t.name for t in catalogue}
    return catalogue


class Shown(NamedTuple):
    """A tool result the model was shown: pydantic-ai's outcome and the content."""

    outcome: str
    content: Any


def returns(result: AgentRunResult[Any]) -> list[Shown]:
    """Every tool result the model was shown, in order."""
    parts = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    return [Shown(p.outcome, p.content) for p in parts]


def run(agent: Agent[None, str], **options: Any) -> AgentRunResult[str]:
    return agent.run_sync("go", **options)


def counted(runs: tuple[str, redis.Redis]) -> int:
    counter, client = runs
    value = client.get(counter)
    return 0 if value is None else int(value)


# -- 1. validation in the proxy ---------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_call_is_refused_before_sending_and_the_model_is_told_which_field_to_fix(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    model = scripted(
        [("idem_count", {"counter": counter, "seconds": "slow"})],
        [("idem_count", {"counter": counter})],
        "fixed",
    )
    agent = Agent(model, tools=tools(kind, "idem_count"))

    result = run(agent)

    refused, accepted = returns(result)
    assert refused.outcome == "retried"
    assert refused.content.startswith("invalid arguments for tool 'idem_count': seconds")
    assert accepted.outcome == "success" and accepted.content["runs"] == 1
    assert counted(runs) == 1  # the refused call never reached the worker
    assert result.output == "fixed"


# -- 2. deadline precedence --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "tool", "proxy", "agent_timeout", "limit"),
    [
        ("remote_tool", "call_context", NOT_SET, 4.0, 4.0),
        ("remote_tool", "call_context", 9.0, 4.0, 9.0),
        ("remote_tool", "call_context", NOT_SET, None, 60.0),
        ("remote_tools", "call_context", NOT_SET, 4.0, 4.0),
        ("remote_tools", "call_context", 9.0, 4.0, 4.0),
        ("remote_tools", "call_context", 9.0, None, 9.0),
        ("remote_tools", "call_context", NOT_SET, None, 60.0),
        ("remote_tools", "own_deadline", 9.0, None, 9.0),
        ("remote_tool", "own_deadline", NOT_SET, 4.0, 4.0),
        ("remote_tool", "own_deadline", NOT_SET, None, 7.0),
        ("remote_tools", "own_deadline", NOT_SET, None, 7.0),
    ],
    ids=[
        "agent-tool-timeout-is-the-framework-default",
        "remote-tool-timeout-wins-over-the-agents",
        "settings-default-without-either",
        "catalogue-under-agent-tool-timeout",
        "agent-tool-timeout-wins-over-remote-tools-default",
        "remote-tools-default-without-an-agent-timeout",
        "catalogue-settings-default",
        "remote-tools-default-wins-over-the-tools-own",
        "agent-tool-timeout-wins-over-the-tools-own",
        "the-tools-own-when-nothing-above-is-set",
        "catalogue-the-tools-own-when-nothing-above-is-set",
    ],
)
def test_the_remote_deadline_follows_toolexecs_precedence_with_the_agents_tool_timeout_as_framework_level(  # noqa: E501
    kind: str,
    tool: str,
    proxy: Timeout,
    agent_timeout: float | None,
    limit: float,
    framework_client: ToolClient,
) -> None:
    model = scripted([(tool, {})], "done")
    agent = Agent(model, tools=tools(kind, tool, timeout=proxy), tool_timeout=agent_timeout)

    (shown,) = returns(run(agent))

    assert limit - 1.0 < shown.content["time_left"] <= limit


def test_a_function_toolsets_timeout_reaches_tools_behind_a_prefix(
    framework_client: ToolClient,
) -> None:
    toolset = FunctionToolset(remote_tools().as_pydantic_ai(), timeout=4.0).prefixed("remote")
    agent = Agent(scripted([("remote_call_context", {})], "done"), toolsets=[toolset])

    (shown,) = returns(run(agent))

    assert 3.0 < shown.content["time_left"] <= 4.0


# -- 3. one agent run is one toolexec run ------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_repeats_within_one_run_share_one_execution_whether_concurrent_or_later(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    args = {"counter": runs[0]}
    model = scripted([("idem_count", args), ("idem_count", args)], [("idem_count", args)], "done")
    agent = Agent(model, tools=tools(kind, "idem_count"))

    result = run(agent)

    shown = [part.content for part in returns(result)]
    assert len(shown) == 3
    assert {r["token"] for r in shown} == {shown[0]["token"]}
    assert {r["runs"] for r in shown} == {1}
    assert {r["run_id"] for r in shown} == {result.run_id}
    assert counted(runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_separate_agent_runs_do_not_share_executions(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    model = scripted([("idem_count", {"counter": runs[0]})], "done")
    agent = Agent(model, tools=tools(kind, "idem_count"))

    first, second = run(agent), run(agent)

    (one,), (two,) = [[p.content for p in returns(r)] for r in (first, second)]
    assert (one["runs"], two["runs"]) == (1, 2)
    assert one["token"] != two["token"]
    assert (one["run_id"], two["run_id"]) == (first.run_id, second.run_id)
    assert counted(runs) == 2


def test_the_run_id_given_to_agent_run_is_the_toolexec_run_id(framework_client: ToolClient) -> None:
    agent = Agent(
        scripted([("call_context", {})], "done"), tools=tools("remote_tool", "call_context")
    )

    (shown,) = returns(run(agent, run_id="order-42"))

    assert shown.content["run_id"] == "order-42"


@dataclass
class Deps:
    """What a pydantic-ai user hands ``agent.run(deps=...)``: their own things, and the run."""

    user: str
    toolexec_run_id: str


@pytest.mark.parametrize(
    "deps",
    [Deps(user="ada", toolexec_run_id="order-42"), {"run_id": "order-42"}],
    ids=["attribute", "key"],
)
def test_deps_that_carry_a_run_id_name_the_run_across_agent_runs_and_over_a_run_scope(
    deps: object, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    model = scripted([("idem_count", {"counter": runs[0]})], "done")
    agent: Agent[Any, str] = Agent(
        model, tools=tools("remote_tool", "idem_count"), deps_type=type(deps)
    )

    first = agent.run_sync("go", deps=deps)
    with run_scope("an-outer-scope"):
        second = agent.run_sync("go", deps=deps)

    (one,), (two,) = [[p.content for p in returns(r)] for r in (first, second)]
    assert one["run_id"] == two["run_id"] == "order-42"
    assert two["token"] == one["token"]
    assert counted(runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_an_enclosing_run_scope_spans_two_agent_runs(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    model = scripted([("idem_count", {"counter": runs[0]})], "done")
    agent = Agent(model, tools=tools(kind, "idem_count"))

    with run_scope() as run_id:
        first, second = run(agent), run(agent, run_id="given-to-the-run")

    (one,), (two,) = [[p.content for p in returns(r)] for r in (first, second)]
    assert one["run_id"] == two["run_id"] == run_id
    assert two["token"] == one["token"]
    assert counted(runs) == 1


# -- 4. timeouts and errors, as pydantic-ai shows them ------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_timeout_is_a_failed_tool_result_naming_the_tool_and_the_run_goes_on_with_no_thread_left(
    kind: str, framework_client: ToolClient
) -> None:
    # The client's one reply listener starts with its first call; count threads after it.
    remote_tool("probe_echo").invoke_sync({"text": "warm", "number": 1})
    threads = threading.active_count()
    proxy = 0.3 if kind == "remote_tool" else NOT_SET
    framework = None if kind == "remote_tool" else 0.3
    model = scripted([("probe_sleep", {"seconds": 2})], "carried on")
    agent = Agent(model, tools=tools(kind, "probe_sleep", timeout=proxy), tool_timeout=framework)

    started = time.monotonic()
    result = run(agent)
    elapsed = time.monotonic() - started

    (shown,) = returns(result)
    assert shown.outcome == "failed"
    assert shown.content == (
        "tool 'probe_sleep' timed out after 0.3s; the call was abandoned. Call it again or carry "
        "on without it."
    )
    assert result.output == "carried on"
    assert elapsed < 2.0  # answered before the 2 s tool could have finished
    assert wait_until(lambda: threading.active_count() <= threads, timeout=5), threading.enumerate()


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_after_a_timeout_waits_for_the_same_execution(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    args = {"counter": runs[0], "seconds": 2.0}
    proxy = 1.5 if kind == "remote_tool" else NOT_SET
    framework = None if kind == "remote_tool" else 1.5
    model = scripted([("idem_count", args)], [("idem_count", args)], "done")
    agent = Agent(model, tools=tools(kind, "idem_count", timeout=proxy), tool_timeout=framework)

    timed_out, joined = returns(run(agent))

    assert timed_out.outcome == "failed"
    assert timed_out.content == (
        "tool 'idem_count' timed out after 1.5s; calling it again with the same arguments waits "
        "for the same execution."
    )
    assert joined.outcome == "success" and joined.content["runs"] == 1
    assert counted(runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_remote_exception_is_a_failed_tool_result_with_its_type_and_message_and_the_run_goes_on(
    kind: str, framework_client: ToolClient
) -> None:
    agent = Agent(
        scripted([("probe_fail", {"message": "boom"})], "carried on"),
        tools=tools(kind, "probe_fail"),
    )

    result = run(agent)

    (shown,) = returns(result)
    assert shown.outcome == "failed"
    assert shown.content == "tool 'probe_fail' failed: ProbeFailure: boom"
    assert result.output == "carried on"


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_arguments_get_max_retries_before_pydantic_ai_ends_the_run(
    kind: str, framework_client: ToolClient
) -> None:
    bad: Step = [("probe_echo", {"text": "x", "number": "one"})]
    within = Agent(scripted(*[bad] * MAX_RETRIES, "gave up"), tools=tools(kind, "probe_echo"))
    beyond = Agent(scripted(*[bad] * (MAX_RETRIES + 1), "never"), tools=tools(kind, "probe_echo"))

    assert run(within).output == "gave up"
    with pytest.raises(
        UnexpectedModelBehavior, match=f"exceeded max retries count of {MAX_RETRIES}"
    ):
        run(beyond)


@pytest.mark.parametrize("kind", KINDS)
def test_four_timeouts_in_a_row_cost_no_retry_and_the_run_ends_with_the_models_answer(
    kind: str, framework_client: ToolClient
) -> None:
    sleep: Step = [("probe_sleep", {"seconds": 1.0})]
    proxy = 0.2 if kind == "remote_tool" else NOT_SET
    framework = None if kind == "remote_tool" else 0.2
    model = scripted(*[sleep] * (MAX_RETRIES + 1), "the model's answer")
    agent = Agent(model, tools=tools(kind, "probe_sleep", timeout=proxy), tool_timeout=framework)

    result = run(agent)

    assert [shown.outcome for shown in returns(result)] == ["failed"] * (MAX_RETRIES + 1)
    assert result.output == "the model's answer"


@pytest.mark.parametrize("kind", KINDS)
def test_failures_never_use_up_the_retries_that_invalid_arguments_get(
    kind: str, framework_client: ToolClient
) -> None:
    fail: Step = [("probe_fail", {"message": "boom"})]
    agent = Agent(
        scripted(*[fail] * (2 * MAX_RETRIES), "carried on"), tools=tools(kind, "probe_fail")
    )

    result = run(agent)

    assert {shown.outcome for shown in returns(result)} == {"failed"}
    assert result.output == "carried on"


def test_an_unreachable_broker_ends_the_run_instead_of_asking_the_model_to_retry(
    framework_client: ToolClient, framework_env: dict[str, str]
) -> None:
    dead = ToolClient(
        Settings.from_env(
            {**framework_env, "TOOLEXEC_BROKER_URL": "redis://127.0.0.1:1/0"},
            default_timeout=1.0,  # a send that cannot connect is retried until the deadline
        )
    )
    try:
        offline = RemoteTool(framework_client.catalog.spec("probe_echo"), client=dead)
        agent = Agent(
            scripted([("probe_echo", {"text": "x", "number": 1})], "never"),
            tools=[offline.as_pydantic_ai()],
        )

        with pytest.raises(BrokerUnavailable):
            run(agent)
    finally:
        dead.close()


# -- 5. approval, as pydantic-ai asks for it ---------------------------------------------


def approving(
    kind: str, counter: str, **options: Any
) -> tuple[Agent[None, Any], AgentRunResult[Any]]:
    """An agent whose model calls ``approved_count`` once, and its first run, paused."""
    model = scripted([("approved_count", {"counter": counter})], "done")
    agent: Agent[None, Any] = Agent(
        model,
        tools=tools(kind, "approved_count"),
        output_type=[str, DeferredToolRequests],
        **options,
    )
    return agent, agent.run_sync("go")


@pytest.mark.parametrize("kind", KINDS)
def test_an_approved_call_is_sent_once_after_the_run_paused_for_it(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agent, paused = approving(kind, runs[0])

    assert isinstance(paused.output, DeferredToolRequests)
    (request,) = paused.output.approvals
    assert (request.tool_name, request.args) == ("approved_count", {"counter": runs[0]})
    assert counted(runs) == 0  # nothing is sent before the approval
    approved = DeferredToolResults(approvals={request.tool_call_id: True})
    result = agent.run_sync(message_history=paused.all_messages(), deferred_tool_results=approved)

    (shown,) = returns(result)
    assert shown.outcome == "success" and shown.content == {"runs": 1}
    assert result.output == "done"
    assert counted(runs) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_denied_call_never_reaches_a_worker_and_the_model_is_told_why(
    kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agent, paused = approving(kind, runs[0])

    (request,) = paused.output.approvals
    denied = DeferredToolResults(approvals={request.tool_call_id: ToolDenied("not this one")})
    result = agent.run_sync(message_history=paused.all_messages(), deferred_tool_results=denied)

    (shown,) = returns(result)
    assert (shown.outcome, shown.content) == ("denied", "not this one")
    assert result.output == "done"
    assert counted(runs) == 0


def test_a_toolset_or_a_proxy_overrides_whether_a_tool_requires_approval(
    framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    trusted = remote_tools(requires_approval={"approved_count": False}).as_pydantic_ai()
    gated = remote_tool("probe_echo", requires_approval=True).as_pydantic_ai()
    agent: Agent[None, Any] = Agent(
        scripted(
            [("approved_count", {"counter": runs[0]}), ("probe_echo", {"text": "x", "number": 1})],
            "done",
        ),
        tools=[t for t in trusted if t.name != "probe_echo"] + [gated],
        output_type=[str, DeferredToolRequests],
    )

    paused = agent.run_sync("go")

    assert isinstance(paused.output, DeferredToolRequests)
    assert [call.tool_name for call in paused.output.approvals] == ["probe_echo"]
    assert counted(runs) == 1  # the toolset's override let it run unasked
    with pytest.raises(
        ValueError, match="requires_approval names tools not in this toolset: 'no_such_tool'"
    ):
        remote_tools(requires_approval={"no_such_tool": True})
    with pytest.raises(TypeError, match="must be True, False or None; got 'yes'"):
        remote_tool("probe_echo", requires_approval="yes")  # type: ignore[arg-type]


# -- 6. progress, as pydantic-ai events ----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_remote_tools_progress_reaches_the_runs_event_stream_as_events_of_its_call(
    kind: str, framework_client: ToolClient
) -> None:
    seen: list[RemoteToolProgress] = []

    async def handler(ctx: RunContext[None], events: Any) -> None:
        async for event in events:
            if isinstance(event, RemoteToolProgress):
                seen.append(event)

    agent = Agent(
        streamed([("progress_steps", {"steps": 3, "pause": 0.15})], "done"),
        tools=tools(kind, "progress_steps"),
    )

    result = agent.run_sync("go", event_stream_handler=handler)

    assert result.output == "done"
    assert seen, "no progress event reached the stream"
    assert {(e.tool_name, e.tool_call_id, e.total) for e in seen} == {
        ("progress_steps", "call-0-0", 3)
    }
    assert [e.done for e in seen] == sorted({e.done for e in seen})
    assert (seen[-1].done, seen[-1].message) == (3, "step 3")  # the last report always arrives


# -- the example -------------------------------------------------------------------------


def test_the_example_prints_what_its_docstring_says(
    framework_env: dict[str, str], framework_worker: WorkerProcess
) -> None:
    assert_example_prints_its_docstring("pydantic_ai_agent.py", framework_env, timeout=60)
