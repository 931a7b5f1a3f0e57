"""A model's tool call carries its arguments as JSON text: ``invoke`` takes that text too."""

from __future__ import annotations

import asyncio

import pytest

from agent_client import ToolArgumentsInvalid, ToolClient, remote_tool

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("probe_worker")]


def test_an_arguments_string_runs_the_tool_as_its_dict_does(tool_client: ToolClient) -> None:
    search = remote_tool("search", timeout=20)

    from_text = search.invoke_sync('{"query": "fox grapes", "limit": 1}')
    from_dict = search.invoke_sync({"query": "fox grapes", "limit": 1})
    awaited = asyncio.run(search.invoke(' {"limit": 1, "query": "fox grapes"} '))

    assert from_text == from_dict == awaited and len(from_text) == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"query": fox}', "not JSON"),
        ('{"query": "fox", "limit": NaN}', "NaN"),
        ('["fox"]', "a JSON object"),
    ],
)
def test_a_bad_arguments_string_is_refused_with_a_message_for_the_model(
    tool_client: ToolClient, text: str, problem: str
) -> None:
    search = remote_tool("search", timeout=20)

    with pytest.raises(ToolArgumentsInvalid, match=problem) as refused:
        search.invoke_sync(text)
    with pytest.raises(ToolArgumentsInvalid, match=problem):
        asyncio.run(search.invoke(text))
    assert str(refused.value).startswith("invalid arguments for tool 'search': ")
