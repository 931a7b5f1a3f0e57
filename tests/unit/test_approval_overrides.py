"""``requires_approval`` on a proxy: the tool's own unless overridden, and bad overrides refused."""

from __future__ import annotations

from typing import Any

import pytest

from agent_client import RemoteTool
from agent_client.approval import approval_overrides
from wire.models import ToolSpec


def spec(name: str, *, requires_approval: bool = False) -> ToolSpec:
    return ToolSpec(
        name=name,
        description="d",
        parameters={"type": "object"},
        requires_approval=requires_approval,
    )


@pytest.mark.parametrize(
    ("own", "override", "expected"),
    [(True, None, True), (False, None, False), (True, False, False), (False, True, True)],
)
def test_a_proxy_requires_approval_as_its_tool_does_unless_it_overrides_it(
    own: bool, override: bool | None, expected: bool
) -> None:
    assert (
        RemoteTool(spec("t", requires_approval=own), requires_approval=override).requires_approval
        is expected
    )


@pytest.mark.parametrize("value", ["yes", 1, 0])
def test_a_proxy_override_that_is_not_true_false_or_none_is_refused_naming_the_tool(
    value: Any,
) -> None:
    with pytest.raises(
        TypeError, match="requires_approval for tool 't' must be True, False or None; got"
    ):
        RemoteTool(spec("t"), requires_approval=value)


def test_one_value_overrides_every_tool_of_a_toolset_and_none_keeps_each_tools_own() -> None:
    names = ["a", "b"]

    assert approval_overrides(True, names) == {"a": True, "b": True}
    assert approval_overrides(None, names) == {"a": None, "b": None}


def test_a_mapping_overrides_the_tools_it_names_only() -> None:
    assert approval_overrides({"a": False}, ["a", "b"]) == {"a": False, "b": None}


def test_a_mapping_naming_a_tool_not_in_the_set_is_refused_listing_the_tools() -> None:
    with pytest.raises(
        ValueError, match="not in this toolset: 'book_flght'; its tools: a, book_flight"
    ):
        approval_overrides({"book_flght": True}, ["book_flight", "a"])


@pytest.mark.parametrize("given", [["a"], "a", {"a": "yes"}])
def test_anything_else_is_refused(given: Any) -> None:
    with pytest.raises(TypeError, match="requires_approval"):
        approval_overrides(given, ["a"])
