"""ScriptedProvider drives a real LazyBridge Agent, offline, with local tools.

These tests also pin down what LazyBridge shows the model when a tool fails or runs out
of time, which the remote tool adapter has to reproduce.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from lazybridge import Tool, ToolTimeoutError
from lazybridge.core.types import Role, ToolResultContent, ToolUseContent

from agent_client.testing import ScriptedProvider, ScriptExhausted, scripted_agent


def _search_tool(calls: list[str]) -> Tool:
    def search(query: str) -> str:
        calls.append(query)
        return f"3 hits for {query}"

    return Tool(search, name="search", description="Search the corpus.")


def test_a_scripted_call_runs_the_local_tool_and_its_result_reaches_the_next_request() -> None:
    calls: list[str] = []
    provider = ScriptedProvider([[("search", {"query": "celery"})], "Celery is a task queue."])
    agent = scripted_agent([_search_tool(calls)], provider)

    envelope = agent("What is Celery?")

    assert envelope.ok, envelope.error
    assert envelope.text() == "Celery is a task queue."
    assert calls == ["celery"]
    assert provider.remaining == 0
    first, second = provider.requests
    assert [definition.name for definition in first.tools] == ["search"]
    assert [message.role for message in first.messages] == [Role.USER]
    assistant, results = second.messages[1:]
    assert assistant.content == [
        ToolUseContent(id="call_0_0", name="search", input={"query": "celery"})
    ]
    assert results.content == [
        ToolResultContent(tool_use_id="call_0_0", content="3 hits for celery", tool_name="search")
    ]
    assert provider.tool_results() == results.content


def test_calls_scripted_in_one_turn_all_run_and_their_results_come_back_in_order() -> None:
    calls: list[str] = []
    provider = ScriptedProvider(
        [[("search", {"query": "redis"}), ("search", {"query": "celery"})], "Both found."]
    )

    envelope = scripted_agent([_search_tool(calls)], provider)("Compare them.")

    assert envelope.text() == "Both found."
    assert sorted(calls) == ["celery", "redis"]
    assert [(r.tool_use_id, r.content) for r in provider.tool_results()] == [
        ("call_0_0", "3 hits for redis"),
        ("call_0_1", "3 hits for celery"),
    ]


def test_a_tool_that_raises_is_shown_to_the_model_as_a_tool_error_and_the_run_goes_on() -> None:
    def lookup(key: str) -> str:
        raise ValueError(f"no entry for {key}")

    provider = ScriptedProvider([[("lookup", {"key": "k1"})], "I could not find it."])

    envelope = scripted_agent([Tool(lookup, name="lookup")], provider)("Look up k1.")

    assert envelope.text() == "I could not find it."
    [shown] = provider.tool_results()
    assert shown.content == "Tool error: no entry for k1"
    assert shown.is_error


def test_a_tool_that_outlasts_tool_timeout_is_shown_as_tool_timeout_and_is_cancelled() -> None:
    cancelled: list[bool] = []

    async def slow(query: str) -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "too late"

    provider = ScriptedProvider([[("slow", {"query": "q"})], "It timed out."])
    agent = scripted_agent([Tool(slow, name="slow")], provider, tool_timeout=0.05)

    started = time.monotonic()
    envelope = agent("Try the slow tool.")

    assert time.monotonic() - started < 2
    assert envelope.text() == "It timed out."
    [shown] = provider.tool_results()
    assert shown.content == "[TOOL_TIMEOUT] Tool 'slow' timed out after 0.05s"
    assert shown.is_error
    assert cancelled == [True]


def test_the_engine_tool_timeout_reads_the_same_to_the_model() -> None:
    async def slow() -> str:
        await asyncio.sleep(5)
        return "too late"

    provider = ScriptedProvider([[("slow", {})], "done"])
    agent = scripted_agent(
        [Tool(slow, name="slow")], provider, engine_options={"tool_timeout": 0.05}
    )

    agent("Try the slow tool.")

    assert provider.tool_results()[0].content == "[TOOL_TIMEOUT] Tool 'slow' timed out after 0.05s"


def test_a_tool_of_its_own_timeout_keeps_it_even_when_the_agent_tool_timeout_is_tighter() -> None:
    async def slowish() -> str:
        await asyncio.sleep(0.3)
        return "made it"

    provider = ScriptedProvider([[("slowish", {})], "done"])
    agent = scripted_agent(
        [Tool(slowish, name="slowish", timeout=2.0)], provider, tool_timeout=0.05
    )

    agent("Try it.")

    assert provider.tool_results()[0].content == "made it"


@pytest.mark.parametrize(
    ("raised", "shown"),
    [
        (
            ToolTimeoutError("the worker ran out of time", tool_name="remote", timeout=1.0),
            "[TOOL_TIMEOUT] the worker ran out of time",
        ),
        (TimeoutError("the worker ran out of time"), "Tool error: the worker ran out of time"),
    ],
)
def test_only_lazybridges_tool_timeout_error_raised_by_a_tool_reads_as_a_timeout(
    raised: Exception, shown: str
) -> None:
    async def remote() -> str:
        raise raised

    provider = ScriptedProvider([[("remote", {})], "done"])

    scripted_agent([Tool(remote, name="remote")], provider, tool_timeout=5)("Call it.")

    [result] = provider.tool_results()
    assert (result.content, result.is_error) == (shown, True)


def test_an_agent_that_asks_past_the_end_of_the_script_gets_an_error_envelope() -> None:
    provider = ScriptedProvider([[("search", {"query": "x"})]])

    envelope = scripted_agent([_search_tool([])], provider)("Search.")

    assert not envelope.ok
    assert envelope.error is not None
    assert envelope.error.type == ScriptExhausted.__name__
    assert len(provider.requests) == 2


def test_a_script_of_turns_builds_its_own_provider_and_streams() -> None:
    agent = scripted_agent([_search_tool([])], [[("search", {"query": "x"})], "Streamed answer."])

    async def collect() -> list[str]:
        return [chunk async for chunk in agent.stream("Search.")]

    chunks = asyncio.run(collect())

    assert "".join(chunks) == "Streamed answer."
    provider = agent.engine.provider
    assert isinstance(provider, ScriptedProvider)
    assert all(request.stream for request in provider.requests)
    assert provider.tool_results()[0].content == "3 hits for x"


@pytest.mark.parametrize(
    ("script", "error", "match"),
    [
        ([], ValueError, "script is empty"),
        ([[]], ValueError, "turn 0 makes no tool calls"),
        (["fine", 42], TypeError, "turn 1 is a int"),
        ([[("search",)]], TypeError, r"turn 0 has the tool call \('search',\)"),
        ([[("search", "query=x")]], TypeError, "write each call as a"),
    ],
)
def test_a_malformed_script_is_rejected_when_the_provider_is_built(
    script: list[object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ScriptedProvider(script)  # type: ignore[arg-type]
