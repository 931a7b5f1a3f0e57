"""A framework's cancel of a run, or of one tool call, is the caller abandoning the call.

Every test drives the real framework with its own test model and cancels the way that
framework cancels: pydantic-ai's ``AgentRun.cancel()`` (``RunCancelled``), its run
``timeout=`` (``RunTimedOut``) and the cancel of the task awaiting ``agent.run``;
openai-agents' cancel of the task awaiting ``Runner.run`` and a streamed run's
``cancel()``; LangGraph's cancel of the task awaiting ``ainvoke`` and a node's
``TimeoutPolicy``; LazyBridge's and locus's cancel of the task awaiting the agent; and
an MCP client abandoning ``tools/call``, which sends ``notifications/cancelled``. Each
honours the tool's ``on_abandon``: ``abandoned`` (``"cancel"``) notes ``start`` then
``stopped`` on the worker within a couple of seconds; ``slow`` (``"leave"``) runs on to
its ``end``. The tools (``tests/integration/handle_tools.py``) note what they did in a
file per token, so what ran on the worker is read, not assumed. The cancellation
reaches the caller as the framework's own (``CancelledError``, ``RunCancelled``...),
never as a tool result the model reads.

A call cancelled by someone else (``toolexec cancel CALL_ID``) is, to the model, a
failure it should not retry: pydantic-ai's ``ToolFailed``, openai-agents'
``[TOOL_CANCELLED]`` text.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest

from agent_client import ToolClient, configure, remote_tool
from tests.integration.frameworks.conftest import ROOT
from tests.integration.polling import wait_until, wait_until_async
from tests.integration.workers import module_worker
from toolexec import ChildProcess, WorkerProcess, free_port
from toolexec.commands.cancel import cancel_call_command
from wire.settings import Settings

pytestmark = pytest.mark.integration

QUEUE = "handles"
#: How long after a cancel the worker must have stopped the tool.
STOPS_WITHIN = 3.0


# -- the worker, the client, the record of what ran ------------------------------------


@pytest.fixture(scope="module")
def env(framework_env: dict[str, str]) -> dict[str, str]:
    """The framework tests' settings, serving the handle tools."""
    return {**framework_env, "TOOLEXEC_TOOL_MODULES": "tests.integration.handle_tools"}


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A prefork worker alone on the ``handles`` queue."""
    with module_worker(
        tmp_path_factory, "cancels", env=env, concurrency=4, queues=(QUEUE,)
    ) as process:
        yield process


@pytest.fixture(autouse=True)
def client(env: dict[str, str], worker: WorkerProcess) -> Iterator[ToolClient]:
    """This process's agent client, pointed at the worker's Redis."""
    tool_client = configure(Settings.from_env(env))
    yield tool_client
    tool_client.close()


class Token:
    """One call's token: the file its tool notes ``start``, ``stopped`` or ``end`` in."""

    def __init__(self, env: dict[str, str]) -> None:
        self.value = uuid.uuid4().hex[:12]
        self._path = Path(env["TOOLEXEC_DATA_DIR"]) / "runs" / self.value

    def arguments(self, seconds: float = 30.0) -> dict[str, Any]:
        return {"token": self.value, "seconds": seconds}

    def noted(self) -> list[str]:
        """What the tool noted, in order."""
        if not self._path.exists():
            return []
        return [line.split()[0] for line in self._path.read_text().splitlines()]

    async def started(self) -> None:
        assert await wait_until_async(lambda: self.noted() == ["start"], timeout=15), self.noted()

    def stopped(self) -> bool:
        """Whether the worker stopped the tool within :data:`STOPS_WITHIN` of now."""
        return wait_until(lambda: self.noted() == ["start", "stopped"], timeout=STOPS_WITHIN)


@pytest.fixture
def token(env: dict[str, str]) -> Token:
    return Token(env)


async def cancel_when_started(token: Token, work: Awaitable[Any]) -> BaseException:
    """Run ``work`` as a task, cancel the task once the tool started; what it raised."""
    task = asyncio.ensure_future(work)
    await token.started()
    task.cancel()
    try:
        await task
    except BaseException as exc:  # noqa: BLE001 - the test asserts which
        return exc
    raise AssertionError("the cancelled run returned")


def sent_calls(client: ToolClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the calls ``client`` sends from now on, in order."""
    ids: list[str] = []
    send = client.publisher.send

    def recording(batch: list[Any]) -> None:
        ids.extend(item.call.call_id for item in batch)
        send(batch)

    monkeypatch.setattr(client.publisher, "send", recording)
    return ids


async def cancel_elsewhere(client: ToolClient, token: Token, calls: list[str]) -> None:
    """Once the tool started, cancel its call as ``toolexec cancel CALL_ID`` does."""
    await token.started()
    (call_id,) = calls
    await asyncio.to_thread(cancel_call_command, client, call_id, as_json=True, out=io.StringIO())


def cancelled_text(tool: str) -> str:
    return (
        f"the call to {tool!r} was cancelled: it was stopped on purpose, so do not call it again "
        "unless you are asked to"
    )


# -- pydantic-ai ---------------------------------------------------------------------------


def pydantic_agent(tool: str, token: Token, *, seconds: float = 30.0) -> Any:
    """A pydantic-ai Agent whose FunctionModel calls ``tool`` once, then answers."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[TextPart("carried on")])
        return ModelResponse(parts=[ToolCallPart(tool, token.arguments(seconds))])

    return Agent(FunctionModel(respond), tools=[remote_tool(tool).as_pydantic_ai()])


def test_cancelling_the_task_of_a_pydantic_ai_run_stops_the_tool_on_the_worker(
    token: Token,
) -> None:
    agent = pydantic_agent("abandoned", token)

    raised = asyncio.run(cancel_when_started(token, agent.run("go")))

    assert isinstance(raised, asyncio.CancelledError)
    assert token.stopped(), token.noted()


def test_a_pydantic_ai_run_cancelled_by_its_token_ends_with_RunCancelled_and_stops_the_tool(
    token: Token,
) -> None:
    from pydantic_ai import CancellationToken
    from pydantic_ai.exceptions import RunCancelled

    agent = pydantic_agent("abandoned", token)
    cancellation = CancellationToken()

    async def main() -> None:
        run = asyncio.ensure_future(agent.run("go", cancellation_token=cancellation))
        await token.started()
        cancellation.cancel()
        with pytest.raises(RunCancelled):
            await run

    asyncio.run(main())
    assert token.stopped(), token.noted()


def test_a_pydantic_ai_agent_run_cancel_stops_the_tool(token: Token) -> None:
    from pydantic_ai.exceptions import RunCancelled

    agent = pydantic_agent("abandoned", token)

    async def main() -> None:
        with pytest.raises(RunCancelled):
            async with agent.iter("go") as run:

                async def stop() -> None:
                    await token.started()
                    run.cancel()

                stopping = asyncio.ensure_future(stop())
                async for _ in run:
                    pass
        await stopping

    asyncio.run(main())
    assert token.stopped(), token.noted()


def test_a_pydantic_ai_run_timeout_ends_with_RunTimedOut_and_stops_the_tool(token: Token) -> None:
    from pydantic_ai.exceptions import RunTimedOut

    agent = pydantic_agent("abandoned", token)

    with pytest.raises(RunTimedOut):
        asyncio.run(agent.run("go", timeout=1.5))
    assert token.noted()[:1] == ["start"]
    assert token.stopped(), token.noted()


def test_a_cancelled_pydantic_ai_run_leaves_a_tool_that_says_leave_running(token: Token) -> None:
    agent = pydantic_agent("slow", token, seconds=1.5)

    raised = asyncio.run(cancel_when_started(token, agent.run("go")))

    assert isinstance(raised, asyncio.CancelledError)
    assert wait_until(lambda: token.noted() == ["start", "end"], timeout=10), token.noted()


def test_a_call_cancelled_elsewhere_is_a_pydantic_ai_tool_failure_and_the_run_goes_on(
    token: Token, client: ToolClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai.messages import ToolReturnPart

    calls = sent_calls(client, monkeypatch)
    agent = pydantic_agent("slow", token)

    async def main() -> Any:
        run = asyncio.ensure_future(agent.run("go"))
        await cancel_elsewhere(client, token, calls)
        return await run

    result = asyncio.run(main())

    (shown,) = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert (shown.outcome, shown.content) == (
        "failed",
        cancelled_text("slow"),
    )  # a failure, not a retry
    assert result.output == "carried on"
    assert token.noted() == ["start", "stopped"]


# -- openai-agents -------------------------------------------------------------------------


def openai_agent(tool: str, token: Token) -> Any:
    """An openai-agents Agent whose ScriptedModel calls ``tool`` once, then answers."""
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message, function_call

    model = ScriptedModel(
        [[function_call(tool, token.arguments(), call_id="c0")], [assistant_message("carried on")]]
    )
    return Agent(name="tester", model=model, tools=[remote_tool(tool).as_openai_agents()])


@pytest.fixture
def untraced() -> Iterator[None]:
    """No traces leave the process (the SDK would export them to OpenAI)."""
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


def test_cancelling_the_task_of_an_openai_agents_run_stops_the_tool_on_the_worker(
    token: Token, untraced: None
) -> None:
    from agents import Runner

    agent = openai_agent("abandoned", token)

    raised = asyncio.run(cancel_when_started(token, Runner.run(agent, "go")))

    assert isinstance(raised, asyncio.CancelledError)
    assert token.stopped(), token.noted()


def test_cancelling_a_streamed_openai_agents_run_stops_the_tool_on_the_worker(
    token: Token, untraced: None
) -> None:
    from agents import Runner

    agent = openai_agent("abandoned", token)

    async def main() -> list[str]:
        result = Runner.run_streamed(agent, "go")

        async def stop() -> None:
            await token.started()
            result.cancel()

        stopping = asyncio.ensure_future(stop())
        events = [event.type async for event in result.stream_events()]
        await stopping
        return events

    asyncio.run(main())
    assert token.stopped(), token.noted()


def test_a_call_cancelled_elsewhere_is_shown_to_the_openai_agents_model_as_cancelled(
    token: Token, client: ToolClient, monkeypatch: pytest.MonkeyPatch, untraced: None
) -> None:
    from agents import Runner, ToolCallOutputItem

    calls = sent_calls(client, monkeypatch)
    agent = openai_agent("slow", token)

    async def main() -> Any:
        run = asyncio.ensure_future(Runner.run(agent, "go"))
        await cancel_elsewhere(client, token, calls)
        return await run

    result = asyncio.run(main())

    (shown,) = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert shown == f"[TOOL_CANCELLED] {cancelled_text('slow')}"
    assert result.final_output == "carried on"


# -- LangChain / LangGraph -----------------------------------------------------------------


def langchain_agent(tool: str, token: Token) -> Any:
    """LangChain's ``create_agent`` (a LangGraph graph) whose fake chat model calls
    ``tool`` once."""
    from examples.langchain_agent import scripted, tool_agent

    return tool_agent(
        scripted([(tool, token.arguments())], "carried on"), [remote_tool(tool).as_langchain()]
    )


def tool_node_graph(tool: Any, **node: Any) -> Any:
    """A LangGraph graph of one ``ToolNode`` running the LangChain ``tool`` (``node``:
    ``add_node``'s options)."""
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([tool]), **node)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile()


def one_call(tool: str, token: Token) -> dict[str, Any]:
    from langchain_core.messages import AIMessage

    call = {"name": tool, "args": token.arguments(), "id": "c1", "type": "tool_call"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def test_cancelling_the_task_of_a_langgraph_run_stops_the_tool_on_the_worker(token: Token) -> None:
    agent = langchain_agent("abandoned", token)

    raised = asyncio.run(cancel_when_started(token, agent.ainvoke({"messages": [("user", "go")]})))

    assert isinstance(raised, asyncio.CancelledError)
    assert token.stopped(), token.noted()


def test_a_langgraph_node_run_timeout_stops_the_tool_on_the_worker(token: Token) -> None:
    from langgraph.errors import NodeTimeoutError
    from langgraph.types import TimeoutPolicy

    graph = tool_node_graph(
        remote_tool("abandoned").as_langchain(), timeout=TimeoutPolicy(run_timeout=1.5)
    )

    with pytest.raises(NodeTimeoutError):
        asyncio.run(graph.ainvoke(one_call("abandoned", token)))
    assert token.noted()[:1] == ["start"]
    assert token.stopped(), token.noted()


def test_a_sync_langgraph_run_cannot_be_cancelled_and_the_calls_deadline_is_what_stops_the_tool(
    token: Token,
) -> None:
    from langchain_core.messages import ToolMessage
    from langgraph.types import TimeoutPolicy

    refused = tool_node_graph(
        remote_tool("abandoned").as_langchain(), timeout=TimeoutPolicy(run_timeout=1.0)
    )
    with pytest.raises(
        ValueError, match="only supported for async nodes"
    ):  # LangGraph's own refusal
        refused.invoke(one_call("abandoned", token))
    graph = tool_node_graph(remote_tool("abandoned", timeout=1.0).as_langchain())

    state = graph.invoke(one_call("abandoned", token))

    (shown,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert shown.status == "error" and "timed out after 1s" in str(shown.content)
    assert token.stopped(), token.noted()


def test_a_call_cancelled_elsewhere_is_an_error_tool_message_in_langchain(
    token: Token, client: ToolClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langchain_core.messages import ToolMessage

    calls = sent_calls(client, monkeypatch)
    agent = langchain_agent("slow", token)

    async def main() -> Any:
        run = asyncio.ensure_future(agent.ainvoke({"messages": [("user", "go")]}))
        await cancel_elsewhere(client, token, calls)
        return await run

    state = asyncio.run(main())

    (shown,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert (shown.status, shown.content) == ("error", cancelled_text("slow"))
    assert state["messages"][-1].content == "carried on"


# -- LazyBridge ----------------------------------------------------------------------------


def lazybridge_agent(tool: str, token: Token, **options: Any) -> Any:
    """A LazyBridge Agent whose ScriptedProvider calls ``tool`` once (``options``: ``Agent``'s)."""
    from agent_client.testing import scripted_agent

    return scripted_agent(
        [remote_tool(tool)], [[(tool, token.arguments())], "carried on"], **options
    )


def test_cancelling_the_task_of_a_lazybridge_run_stops_the_tool_on_the_worker(token: Token) -> None:
    agent = lazybridge_agent("abandoned", token)

    raised = asyncio.run(cancel_when_started(token, agent.run("go")))

    assert isinstance(raised, asyncio.CancelledError)
    assert token.stopped(), token.noted()


def test_a_lazybridge_agent_timeout_stops_the_tool_on_the_worker(token: Token) -> None:
    agent = lazybridge_agent("abandoned", token, timeout=1.5)

    envelope = asyncio.run(agent.run("go"))

    assert envelope.error is not None and "exceeded timeout=1.5s" in str(envelope.error)
    assert token.noted()[:1] == ["start"]
    assert token.stopped(), token.noted()


# -- locus ---------------------------------------------------------------------------------


def locus_agent(tool: str, token: Token) -> Any:
    """A locus Agent whose ScriptedModel calls ``tool`` once, then answers."""
    from locus.agent.agent import Agent
    from locus.testing import ScriptedModel, text, tool_call

    model = ScriptedModel([tool_call(tool, **token.arguments()), text("carried on")])
    return Agent(model=model, tools=[remote_tool(tool).as_locus()], context_window=32_000)


def test_cancelling_the_task_of_a_locus_run_stops_the_tool_on_the_worker(token: Token) -> None:
    agent = locus_agent("abandoned", token)

    raised = asyncio.run(cancel_when_started(token, agent.arun("go")))

    assert isinstance(raised, asyncio.CancelledError)
    assert token.stopped(), token.noted()


def test_a_locus_agent_cancel_abandons_the_call_stops_the_tool_and_ends_the_run_cancelled(
    token: Token,
) -> None:
    from locus.agent.subagent import _PARENT_RUN  # the adapter reads the run's signal here

    agent = locus_agent("abandoned", token)

    async def main() -> Any:
        run = asyncio.ensure_future(agent.arun("go"))
        await token.started()
        assert agent.cancel() == 1
        return await run

    result = asyncio.run(main())

    assert _PARENT_RUN.get() is None
    assert token.stopped(), token.noted()
    assert result.stop_reason == "cancelled"
    shown = [str(m.content) for m in result.state.messages if m.role == "tool"]
    assert shown == [
        "Error: ToolCancelled: the call to 'abandoned' was cancelled: its locus run was cancelled"
    ]


# -- MCP -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_http(
    env: dict[str, str], worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``toolexec mcp --http PORT`` for the module; its URL."""
    port = free_port()
    process = ChildProcess(
        "mcp-http",
        [sys.executable, "-m", "toolexec", "mcp", "--http", str(port)],
        env={**os.environ, **env},
        cwd=ROOT,
        log_dir=tmp_path_factory.mktemp("cancels-mcp"),
    )
    with process:
        assert wait_until(lambda: accepts(port) or not process.is_running, timeout=30), (
            process.log_tail()
        )
        yield f"http://127.0.0.1:{port}/mcp"


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


async def abandon_once_started(token: Token, call: Callable[[], Awaitable[Any]]) -> None:
    """Await ``call()`` in a cancel scope that is cancelled once the tool started."""
    async with anyio.create_task_group() as group:

        async def calling() -> None:
            await call()
            raise AssertionError("the abandoned call returned")

        group.start_soon(calling)
        await token.started()
        group.cancel_scope.cancel()


def test_an_mcp_client_abandoning_a_stdio_tools_call_sends_notifications_cancelled_and_the_tool_stops(  # noqa: E501
    token: Token, env: dict[str, str], tmp_path: Path
) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "toolexec", "mcp"], env=env, cwd=ROOT
    )

    async def main(errlog: TextIO) -> None:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await abandon_once_started(
                token, lambda: session.call_tool("abandoned", token.arguments())
            )
            assert await wait_until_async(
                lambda: token.noted() == ["start", "stopped"], timeout=STOPS_WITHIN
            )
            assert "abandoned" in {
                tool.name for tool in (await session.list_tools()).tools
            }  # still serving

    with open(tmp_path / "mcp-stdio.log", "w") as errlog:
        anyio.run(main, errlog)
    assert token.noted() == ["start", "stopped"]


def test_an_mcp_client_abandoning_a_2026_http_tools_call_stops_the_tool(
    token: Token, mcp_http: str
) -> None:
    from mcp import Client

    async def main() -> None:
        async with Client(mcp_http, cache=None) as client:
            await abandon_once_started(
                token, lambda: client.call_tool("abandoned", token.arguments())
            )
            assert await wait_until_async(
                lambda: token.noted() == ["start", "stopped"], timeout=STOPS_WITHIN
            )

    anyio.run(main)
    assert token.noted() == ["start", "stopped"]


def test_an_mcp_read_timeout_cancels_the_request_and_the_tool_stops(
    token: Token, mcp_http: str
) -> None:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    async def main() -> None:
        async with Client(mcp_http, cache=None) as client:
            with pytest.raises((MCPError, TimeoutError)):
                await client.call_tool("abandoned", token.arguments(), read_timeout_seconds=1.5)
            assert await wait_until_async(
                lambda: token.noted() == ["start", "stopped"], timeout=STOPS_WITHIN
            )

    anyio.run(main)


def test_an_mcp_client_abandoning_a_call_of_a_tool_that_says_leave_lets_it_run_on(
    token: Token, mcp_http: str
) -> None:
    from mcp import Client

    async def main() -> None:
        async with Client(mcp_http, cache=None) as client:
            await abandon_once_started(
                token, lambda: client.call_tool("slow", token.arguments(1.5))
            )

    anyio.run(main)
    assert wait_until(lambda: token.noted() == ["start", "end"], timeout=10), token.noted()
