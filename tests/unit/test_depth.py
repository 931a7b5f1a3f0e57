"""wire.depth: one nesting limit for arguments and results, measured on the JSON text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_client.errors import ToolArgumentsInvalid
from agent_client.validation import ArgumentValidator
from executor.outcomes import encode_outcome
from wire.depth import MAX_DEPTH, json_depth, too_deep
from wire.models import CallOutcome

#: Strings that look like JSON structure: brackets, quotes and backslashes.
_TRICKY = st.text(alphabet='[]{}"\\,:ab \n', max_size=12)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY, inner, max_size=4),
    max_leaves=40,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


@settings(max_examples=300, deadline=None)
@given(value=_JSON, indent=st.sampled_from([None, 1]))
def test_the_depth_of_the_text_is_the_depth_of_the_value_it_encodes(
    value: Any, indent: int | None
) -> None:
    text = json.dumps(value, indent=indent)

    assert json_depth(text) == _depth(value)
    assert json_depth(text.encode()) == _depth(value)


@pytest.mark.parametrize(
    ("levels", "deep"), [(0, False), (MAX_DEPTH, False), (MAX_DEPTH + 1, True), (900, True)]
)
def test_too_deep_counts_the_levels_a_wrapper_adds_apart(levels: int, deep: bool) -> None:
    assert too_deep(json.dumps(_nested(levels))) is deep
    assert too_deep(json.dumps({"wrapped": _nested(levels)}), around=1) is deep


def test_many_shallow_brackets_are_not_deep() -> None:
    assert not too_deep(json.dumps([[1], {"a": [2]}] * 10_000))


def _validator() -> ArgumentValidator:
    schema = {"type": "object", "properties": {"tree": {}}, "additionalProperties": False}
    return ArgumentValidator("probe", schema, max_bytes=1 << 20)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 500, 990])
def test_the_client_refuses_arguments_nested_deeper_than_the_limit_naming_the_field(
    levels: int,
) -> None:
    with pytest.raises(ToolArgumentsInvalid) as refused:
        _validator().check({"tree": _nested(levels)})

    assert f"tree: nested deeper than {MAX_DEPTH} levels" in str(refused.value)


def test_the_client_sends_arguments_nested_as_deep_as_the_limit() -> None:
    encoded = _validator().check({"tree": _nested(MAX_DEPTH)})

    assert json_depth(encoded) == MAX_DEPTH + 1  # the arguments' own object around them


@pytest.mark.parametrize(
    ("levels", "refused"), [(MAX_DEPTH, False), (MAX_DEPTH + 1, True), (199, True)]
)
def test_a_result_nested_deeper_than_the_limit_is_an_error_that_says_so(
    levels: int, refused: bool
) -> None:
    text = encode_outcome(
        CallOutcome.success("c-1", _nested(levels)), tool="probe", max_bytes=1 << 20
    )
    outcome = CallOutcome.model_validate_json(text)

    if not refused:
        assert outcome.ok and outcome.result == _nested(levels)
        return
    assert outcome.error is not None and outcome.error.type == "UnserializableResult"
    assert f"nested deeper than {MAX_DEPTH} levels" in outcome.error.message
