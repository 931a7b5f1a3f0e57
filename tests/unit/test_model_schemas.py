"""A RemoteTool hands its catalog schema to model APIs unchanged."""

from __future__ import annotations

from typing import cast

from agent_client import RemoteTool, ToolClient
from wire.models import ToolSpec

PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What to look for."}},
    "required": ["query"],
    "additionalProperties": False,
}


def a_tool() -> RemoteTool:
    spec = ToolSpec(name="search", description="Search the corpus.", parameters=PARAMETERS)
    return RemoteTool(spec, client=cast(ToolClient, object()))


def test_the_openai_schema_is_a_function_tool_with_the_catalogs_parameters() -> None:
    assert a_tool().to_openai_schema() == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.",
            "parameters": PARAMETERS,
        },
    }


def test_the_anthropic_schema_carries_the_parameters_as_its_input_schema() -> None:
    assert a_tool().to_anthropic_schema() == {
        "name": "search",
        "description": "Search the corpus.",
        "input_schema": PARAMETERS,
    }


def test_the_proxy_exposes_the_specs_name_description_parameters_and_idempotence() -> None:
    tool = a_tool()
    assert (tool.name, tool.description, tool.parameters, tool.idempotent) == (
        "search",
        "Search the corpus.",
        PARAMETERS,
        False,
    )
