"""LangChain tools from ``as_langchain()`` in a real LangChain agent loop, against a real worker.

The agent is LangChain's ``create_agent`` (a LangGraph graph whose ``ToolNode`` runs
the tools); the model is LangChain's own fake chat model (``GenericFakeChatModel``),
taught to accept ``bind_tools`` (``ScriptedChatModel`` in
``examples/langchain_agent.py``). Each promise is checked for ``remote_tool()`` and
``remote_tools()``, and on the sync (``invoke``) and async (``ainvoke``) paths.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import NodeTimeoutError
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, TimeoutPolicy

from agent_client import (
    BrokerUnavailable,
    RemoteTool,
    ToolClient,
    remote_tool,
    remote_tools,
    run_scope,
)
from agent_client.deadline import NOT_SET, Timeout
from agent_client.frameworks.langchain import TOOL_PROGRESS, ApprovalUnavailable
from agent_client.options import CallOptions
from examples.langchain_agent import Turn, scripted, tool_agent
from tests.integration.deadlines import as_set
from tests.integration.frameworks.examples import assert_example_prints_its_docstring
from tests.integration.polling import wait_until
from toolexec import WorkerProcess
from wire.settings import Settings

pytestmark = pytest.mark.integration

#: Builds the LangChain tools an agent gets: ``make(*names, timeout=...)``.
MakeTools = Callable[..., list[BaseTool]]


@pytest.fixture(params=["remote_tool", "remote_tools"])
def make_tools(request: pytest.FixtureRequest, framework_client: ToolClient) -> MakeTools:
    """The tools named, one ``remote_tool`` each, or the whole ``remote_tools()`` catalogue."""

    def make(*names: str, timeout: Timeout = NOT_SET) -> list[BaseTool]:
        if request.param == "remote_tool":
            return [remote_tool(name, timeout=timeout).as_langchain() for name in names]
        tools: list[BaseTool] = remote_tools(default_timeout=timeout).as_langchain()
        assert set(names) <= {tool.name for tool in tools}
        return tools

    return make


@pytest.fixture(params=["invoke", "ainvoke"])
def mode(request: pytest.FixtureRequest) -> str:
    """Run the agent with ``invoke`` (sync tools) or ``ainvoke`` (async tools)."""
    return str(request.param)


def run_agent(
    tools: list[BaseTool], *turns: Turn, mode: str = "ainvoke", config: RunnableConfig | None = None
) -> dict[str, Any]:
    """One invocation of an agent whose model plays ``turns``; its final state."""
    agent = tool_agent(scripted(*turns), tools)
    question = {"messages": [("user", "go")]}
    if mode == "invoke":
        state: dict[str, Any] = agent.invoke(question, config)
    else:
        state = asyncio.run(agent.ainvoke(question, config))
    return state


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    """The tool results the model saw, in order."""
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def results(state: dict[str, Any]) -> list[Any]:
    """The values of the tool results (each ``ToolMessage.artifact``), in order."""
    return [m.artifact for m in tool_messages(state)]


def answer(state: dict[str, Any]) -> str:
    return str(state["messages"][-1].content)


def executions(runs: tuple[str, redis.Redis]) -> int:
    """How many times ``idem_count`` ran under the test's counter."""
    counter, store = runs
    return int(store.get(counter) or 0)


# -- the tool ---------------------------------------------------------------------------


def test_the_tool_carries_the_remote_schema_and_both_sync_and_async_bodies(
    framework_client: ToolClient,
) -> None:
    remote = remote_tool("search")

    tool = remote.as_langchain()

    assert isinstance(tool, StructuredTool)
    assert (tool.name, tool.description) == (remote.name, remote.description)
    assert tool.args_schema == remote.parameters
    assert tool.func is not None and tool.coroutine is not None
    # What a model is offered: the JSON Schema, without the config parameter.
    assert set(tool.args) == set(remote.parameters["properties"])


def test_an_agent_calls_a_remote_tool_and_reads_its_result_as_json(
    make_tools: MakeTools, mode: str
) -> None:
    state = run_agent(
        make_tools("search"),
        [("search", {"query": "red-headed league", "limit": 1})],
        "done",
        mode=mode,
    )

    (shown,) = tool_messages(state)
    assert shown.status == "success"
    assert json.loads(str(shown.content))[0]["source"] == "the-red-headed-league.txt"
    assert shown.artifact[0]["source"] == "the-red-headed-league.txt"  # the value, not its text
    assert answer(state) == "done"


# -- 1. validation in the proxy ---------------------------------------------------------


def test_a_bad_call_is_refused_before_sending_and_the_model_reads_which_field(
    make_tools: MakeTools,
    mode: str,
    framework_client: ToolClient,
    runs: tuple[str, redis.Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[object] = []
    monkeypatch.setattr(framework_client.publisher, "send", sent.append)
    counter, _ = runs

    state = run_agent(
        make_tools("book_flight", "idem_count"),
        [
            ("book_flight", {"flight_id": "tomorrow", "passenger": "Ada"}),
            ("idem_count", {"counter": counter, "seconds": "a while"}),
        ],
        "carried on",
        mode=mode,
    )

    flight, count = tool_messages(state)
    assert flight.status == count.status == "error"
    assert flight.content == (
        "invalid arguments for tool 'book_flight': flight_id: 'tomorrow' does not match "
        "'^[A-Z0-9]{2}[0-9]{1,4}$'"
    )
    assert (
        count.content
        == "invalid arguments for tool 'idem_count': seconds: 'a while' is not of type 'number'"
    )
    assert sent == []  # nothing reached the broker
    assert executions(runs) == 0
    assert answer(state) == "carried on"


# -- 4. errors and timeouts -------------------------------------------------------------


def test_a_tool_failure_is_shown_to_the_model_and_the_run_goes_on(
    make_tools: MakeTools, mode: str
) -> None:
    state = run_agent(
        make_tools("probe_fail"), [("probe_fail", {"message": "no fuel"})], "carried on", mode=mode
    )

    (shown,) = tool_messages(state)
    assert (shown.status, shown.content) == (
        "error",
        "tool 'probe_fail' failed: ProbeFailure: no fuel",
    )
    assert answer(state) == "carried on"


def test_a_timeout_is_shown_to_the_model_and_the_run_goes_on(
    make_tools: MakeTools, mode: str
) -> None:
    tools = make_tools("probe_sleep", timeout=0.3)

    started = time.monotonic()
    state = run_agent(tools, [("probe_sleep", {"seconds": 4})], "carried on", mode=mode)
    elapsed = time.monotonic() - started

    (shown,) = tool_messages(state)
    assert (shown.status, shown.content) == ("error", "tool 'probe_sleep' timed out after 0.3s")
    assert answer(state) == "carried on"
    assert elapsed < 4.0  # answered before the 4 s tool could have finished


def test_an_async_agent_waits_out_timeouts_on_its_event_loop_and_leaves_no_thread_behind(
    make_tools: MakeTools, framework_client: ToolClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = make_tools("probe_sleep", "search", timeout=0.3)
    run_agent(tools, [("search", {"query": "fox"})], "warm")  # the client's reply listener starts
    before = threading.active_count()
    waited_on: list[str] = []
    call = framework_client.call

    async def recording(*args: Any, **kwargs: Any) -> Any:
        waited_on.append(threading.current_thread().name)
        return await call(*args, **kwargs)

    monkeypatch.setattr(framework_client, "call", recording)

    state = run_agent(tools, [("probe_sleep", {"seconds": 3})] * 3, "carried on")

    assert [m.status for m in tool_messages(state)] == ["error"] * 3
    assert waited_on == [threading.main_thread().name] * 3  # awaited on the loop, not in a thread
    assert wait_until(lambda: threading.active_count() <= before, timeout=5), threading.enumerate()


def test_a_sync_agent_that_runs_into_timeouts_leaves_no_thread_behind(
    make_tools: MakeTools,
) -> None:
    tools = make_tools("probe_sleep", "search", timeout=0.3)
    # The client's reply listener starts with the first call.
    run_agent(tools, [("search", {"query": "fox"})], "warm", mode="invoke")
    before = threading.active_count()

    started = time.monotonic()
    state = run_agent(tools, [("probe_sleep", {"seconds": 3})] * 3, "carried on", mode="invoke")
    elapsed = time.monotonic() - started

    assert [m.status for m in tool_messages(state)] == ["error"] * 3
    assert answer(state) == "carried on"
    assert elapsed < 3.0  # side by side, each answered before its 3 s tool could finish
    # LangGraph runs a step's tool calls on threads of its own; none is left waiting.
    assert wait_until(lambda: threading.active_count() <= before, timeout=5), threading.enumerate()


def test_an_unreachable_broker_fails_the_run_instead_of_asking_the_model(
    framework_client: ToolClient, framework_env: dict[str, str], mode: str
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    dead = ToolClient(
        Settings.from_env(
            {**framework_env, "TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": url},
            default_timeout=1.0,  # a send that cannot connect is retried until the deadline
        )
    )
    try:
        tool = RemoteTool(framework_client.catalog.spec("search"), client=dead).as_langchain()
        with pytest.raises(BrokerUnavailable):
            run_agent([tool], [("search", {"query": "fox"})], "never reached", mode=mode)
    finally:
        dead.close()


# -- 3. one LangGraph invocation is one toolexec run ------------------------------------


def counting(counter: str) -> tuple[str, dict[str, Any]]:
    return ("idem_count", {"counter": counter})


def test_repeats_within_one_invocation_share_one_execution_and_a_new_invocation_runs_again(
    make_tools: MakeTools, mode: str, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    tools = make_tools("idem_count")
    # Two identical calls in one step, then the model repeats it in the next step.
    script = ([counting(counter), counting(counter)], [counting(counter)], "done")

    first = results(run_agent(tools, *script, mode=mode))
    second = results(run_agent(tools, *script, mode=mode))

    assert len({r["token"] for r in first}) == 1 and first[0]["runs"] == 1
    assert len({r["run_id"] for r in first}) == 1 and first[0]["run_id"].startswith("langgraph-")
    assert len({r["token"] for r in second}) == 1 and second[0]["runs"] == 2
    assert second[0]["run_id"] != first[0]["run_id"]
    assert executions(runs) == 2


RUN_CONFIGS = {
    "configurable toolexec_run_id": lambda run: {"configurable": {"toolexec_run_id": run}},
    "LangGraph run_id": lambda run: {"run_id": run},
    "metadata run_id": lambda run: {"metadata": {"run_id": run}},
}


@pytest.mark.parametrize("given", list(RUN_CONFIGS))
def test_a_run_id_in_the_config_names_the_run_across_invocations(
    given: str, make_tools: MakeTools, mode: str, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    run = str(uuid.uuid4())
    config: RunnableConfig = RUN_CONFIGS[given](run)  # type: ignore[assignment]
    tools = make_tools("idem_count")

    seen = [
        results(run_agent(tools, [counting(counter)], "done", mode=mode, config=config))
        for _ in range(2)
    ]

    assert [r["run_id"] for (r,) in seen] == [run, run]
    assert seen[0][0]["token"] == seen[1][0]["token"]
    assert executions(runs) == 1


def test_an_enclosing_run_scope_spans_invocations(
    make_tools: MakeTools, mode: str, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    tools = make_tools("idem_count")

    with run_scope() as run:
        seen = [results(run_agent(tools, [counting(counter)], "done", mode=mode)) for _ in range(2)]

    assert [r["run_id"] for (r,) in seen] == [run, run]
    assert executions(runs) == 1


def test_outside_langgraph_the_parent_run_is_the_run(
    make_tools: MakeTools, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    (tool,) = [t for t in make_tools("idem_count") if t.name == "idem_count"]
    call = {"name": "idem_count", "args": {"counter": counter}, "id": "c1", "type": "tool_call"}

    def agent_loop(_: object, config: RunnableConfig) -> list[Any]:
        # A hand-written loop that calls the tool twice inside one LangChain run.
        return [tool.invoke(call, config).artifact for _ in range(2)]

    loop = RunnableLambda(agent_loop)
    first, second = loop.invoke("go"), loop.invoke("go")
    alone = [json.loads(tool.invoke({"counter": counter})) for _ in range(2)]  # no parent run

    assert first[0]["token"] == first[1]["token"] != second[0]["token"] == second[1]["token"]
    assert first[0]["run_id"] != second[0]["run_id"]
    assert alone[0]["token"] != alone[1]["token"]
    assert executions(runs) == 4


# -- 2. deadlines: proxy > remote_tools(default_timeout=) > the tool's own > settings ----


DEADLINES = {
    "the proxy's timeout": (lambda: remote_tool("call_context", timeout=9).as_langchain(), 9.0),
    "remote_tools default_timeout": (
        lambda: remote_tools(default_timeout=4)["call_context"].as_langchain(),
        4.0,
    ),
    "remote_tools default_timeout over the tool's own": (
        lambda: remote_tools(default_timeout=9)["own_deadline"].as_langchain(),
        9.0,
    ),
    "the tool's own timeout": (lambda: remote_tool("own_deadline").as_langchain(), 7.0),
    "the settings default": (lambda: remote_tool("call_context").as_langchain(), 60.0),
}


@pytest.mark.parametrize("level", list(DEADLINES))
def test_the_worker_gets_the_deadline_of_the_highest_level_set(
    level: str, mode: str, framework_client: ToolClient
) -> None:
    make, limit = DEADLINES[level]
    tool = make()

    state = run_agent([tool], [(tool.name, {})], "done", mode=mode)

    (context,) = results(state)
    time_left = context["time_left"]
    assert as_set(time_left, limit)


def test_the_proxys_timeout_wins_over_remote_tools_default_and_that_over_the_tools_own(
    framework_client: ToolClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    deadlines: list[float | None] = []
    call = framework_client.call

    async def recording(
        spec: Any, arguments: dict[str, Any], options: CallOptions, **kwargs: Any
    ) -> Any:
        deadlines.append(options.timeout)
        return await call(spec, arguments, options, **kwargs)

    monkeypatch.setattr(framework_client, "call", recording)
    spec = framework_client.catalog.spec("charge_card")  # @tool(timeout=10)
    charge = {
        "customer_id": "cus_1",
        "amount_cents": 100,
        "billing": {"city": "Leeds", "country": "GB"},
    }
    tools = [
        RemoteTool(spec, timeout=2, default_timeout=4).as_langchain(),
        RemoteTool(spec, default_timeout=4).as_langchain(),
        RemoteTool(spec).as_langchain(),
    ]

    for tool in tools:
        state = run_agent([tool], [("charge_card", charge)], "done")
        assert tool_messages(state)[0].status == "success"

    assert deadlines == [2.0, 4.0, 10.0]


# -- approval, as LangChain asks for it: LangGraph's interrupt ------------------------------


def approval_run(
    tools: list[BaseTool], counter: str, mode: str
) -> tuple[Any, RunnableConfig, dict[str, Any]]:
    """A checkpointed agent whose model calls ``approved_count`` once; its state, paused."""
    agent = tool_agent(
        scripted([("approved_count", {"counter": counter})], "done"),
        tools,
        checkpointer=InMemorySaver(),
    )
    config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex}}
    return agent, config, invoke(agent, {"messages": [("user", "go")]}, config, mode)


def invoke(agent: Any, given: Any, config: RunnableConfig, mode: str) -> dict[str, Any]:
    if mode == "invoke":
        state: dict[str, Any] = agent.invoke(given, config)
    else:
        state = asyncio.run(agent.ainvoke(given, config))
    return state


@pytest.mark.parametrize(
    ("decision", "runs_after", "shown"),
    [
        ({"type": "approve"}, 1, '{"runs": 1}'),
        (
            {"type": "reject", "message": "not today"},
            0,
            "User rejected the tool call for `approved_count` with reason: not today",
        ),
    ],
    ids=["approved", "rejected"],
)
def test_a_call_waits_at_langgraphs_interrupt_and_runs_once_if_approved_never_if_rejected(
    make_tools: MakeTools,
    mode: str,
    runs: tuple[str, redis.Redis],
    decision: dict[str, str],
    runs_after: int,
    shown: str,
) -> None:
    agent, config, paused = approval_run(make_tools("approved_count"), runs[0], mode)

    (pending,) = paused["__interrupt__"]
    assert pending.value["type"] == "tool_approval"
    assert (pending.value["name"], pending.value["args"]) == (
        "approved_count",
        {"counter": runs[0]},
    )
    assert pending.value["tool_call_id"] == "call-0-0"
    assert executions(runs) == 0  # nothing is sent before the decision
    state = invoke(agent, Command(resume=decision), config, mode)

    (message,) = tool_messages(state)
    assert message.content == shown
    assert message.status == ("success" if runs_after else "error")
    assert answer(state) == "done"
    assert executions(runs) == runs_after


def test_a_resume_that_is_not_a_decision_is_refused_naming_the_two(
    framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agent, config, _ = approval_run(
        [remote_tool("approved_count").as_langchain()], runs[0], "invoke"
    )

    with pytest.raises(ValueError, match="resume with {'type': 'approve'} or {'type': 'reject'"):
        agent.invoke(Command(resume="yes please"), config)

    assert executions(runs) == 0


def test_a_tool_that_requires_approval_refuses_to_run_outside_a_langgraph_graph(
    framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    tool = remote_tool("approved_count").as_langchain()
    trusted = remote_tool("approved_count", requires_approval=False).as_langchain()

    with pytest.raises(
        ApprovalUnavailable, match="requires approval, which LangChain asks for with LangGraph"
    ):
        tool.invoke({"counter": runs[0]})
    assert executions(runs) == 0
    assert trusted.invoke({"counter": runs[0]}) == '{"runs": 1}'


# -- progress: the graph's custom stream, and its idle timeout -----------------------------


def test_progress_reaches_the_graphs_custom_stream_as_events_of_the_call(
    make_tools: MakeTools, mode: str
) -> None:
    agent = tool_agent(
        scripted([("progress_steps", {"steps": 3, "pause": 0.15})], "done"),
        make_tools("progress_steps"),
    )
    question = {"messages": [("user", "go")]}

    async def collect() -> list[Any]:
        return [chunk async for chunk in agent.astream(question, stream_mode="custom")]

    chunks = (
        list(agent.stream(question, stream_mode="custom"))
        if mode == "invoke"
        else asyncio.run(collect())
    )

    progress = [c for c in chunks if isinstance(c, dict) and c.get("type") == TOOL_PROGRESS]
    assert progress, chunks
    assert {(c["tool"], c["tool_call_id"], c["total"]) for c in progress} == {
        ("progress_steps", "call-0-0", 3)
    }
    assert (progress[-1]["done"], progress[-1]["message"]) == (
        3,
        "step 3",
    )  # the last one always arrives


def tool_graph(tools: list[BaseTool], timeout: TimeoutPolicy) -> Any:
    """A graph of one ``ToolNode`` under ``timeout``."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools), timeout=timeout)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def one_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": [
            AIMessage(
                content="",
                tool_calls=[{"name": name, "args": args, "id": "c1", "type": "tool_call"}],
            )
        ]
    }


@pytest.mark.parametrize("refresh_on", ["auto", "heartbeat"])
def test_progress_refreshes_a_nodes_idle_timeout_while_its_run_timeout_stays(
    framework_client: ToolClient, refresh_on: str
) -> None:
    tools = [
        remote_tool("progress_steps").as_langchain(),
        remote_tool("probe_sleep").as_langchain(),
    ]
    policy = TimeoutPolicy(idle_timeout=0.8, run_timeout=3.0, refresh_on=refresh_on)  # type: ignore[arg-type]
    graph = tool_graph(tools, policy)
    reporting = one_call(
        "progress_steps", {"steps": 6, "pause": 0.3}
    )  # 1.8 s, a report every 0.3 s

    state = asyncio.run(graph.ainvoke(reporting))
    with pytest.raises(NodeTimeoutError) as idle:
        asyncio.run(graph.ainvoke(one_call("probe_sleep", {"seconds": 1.8})))
    with pytest.raises(NodeTimeoutError) as total:
        asyncio.run(graph.ainvoke(one_call("progress_steps", {"steps": 12, "pause": 0.3})))

    assert tool_messages(state)[0].artifact == {
        "steps": 6
    }  # 1.8 s of work under a 0.8 s idle timeout
    assert idle.value.kind == "idle"
    assert total.value.kind == "run"  # progress never stretches the hard total


# -- the example --------------------------------------------------------------------------


def test_the_example_prints_what_its_docstring_says(
    framework_env: dict[str, str], framework_worker: WorkerProcess
) -> None:
    assert_example_prints_its_docstring("langchain_agent.py", framework_env)
