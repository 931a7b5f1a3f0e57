"""agent_client.validation: a bad call is refused at the edge, naming each field."""

from __future__ import annotations

import datetime
import math
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from agent_client.errors import RemoteToolError, ToolArgumentsInvalid
from agent_client.validation import ArgumentValidator
from executor.schema import function_schema


class Address(BaseModel):
    city: str
    postcode: str = ""


def deliver(
    item: str,
    quantity: Annotated[int, Field(ge=1, le=10)],
    address: Address,
    speed: Literal["standard", "express"] = "standard",
    note: Any = None,
    weight: float = 1.0,
) -> str:
    """Deliver an item."""
    return item


SCHEMA = function_schema(deliver, name="deliver").parameters
GOOD: dict[str, Any] = {"item": "book", "quantity": 2, "address": {"city": "York"}}


def check(arguments: Any, *, max_bytes: int = 10_000) -> None:
    ArgumentValidator("deliver", SCHEMA, max_bytes=max_bytes).check(arguments)


def problems_of(arguments: Any, *, max_bytes: int = 10_000) -> tuple[str, ...]:
    with pytest.raises(ToolArgumentsInvalid) as info:
        check(arguments, max_bytes=max_bytes)
    assert info.value.tool == "deliver"
    assert str(info.value).startswith("invalid arguments for tool 'deliver': ")
    return info.value.problems


def test_arguments_that_fit_the_schema_pass() -> None:
    check(GOOD)
    check({**GOOD, "speed": "express", "note": {"anything": [1, "json"]}, "weight": 2})


def test_a_missing_required_field_is_named() -> None:
    assert problems_of({"item": "book", "address": {"city": "York"}}) == (
        "'quantity' is a required property",
    )


def test_a_wrong_type_is_named_by_its_field() -> None:
    assert problems_of({**GOOD, "quantity": "two"}) == ("quantity: 'two' is not of type 'integer'",)


def test_a_value_above_the_maximum_is_named_with_the_bound() -> None:
    assert problems_of({**GOOD, "quantity": 11}) == (
        "quantity: 11 is greater than the maximum of 10",
    )


def test_a_value_outside_a_literal_is_named_with_the_allowed_values() -> None:
    assert problems_of({**GOOD, "speed": "warp"}) == (
        "speed: 'warp' is not one of ['standard', 'express']",
    )


def test_an_unexpected_field_is_named() -> None:
    (problem,) = problems_of({**GOOD, "colour": "red"})

    assert "Additional properties are not allowed ('colour' was unexpected)" in problem


def test_a_nested_field_is_named_by_its_path() -> None:
    assert problems_of({**GOOD, "address": {"city": 5}}) == (
        "address.city: 5 is not of type 'string'",
    )


def test_a_missing_nested_field_is_named_under_its_parent() -> None:
    assert problems_of({**GOOD, "address": {}}) == ("address: 'city' is a required property",)


def test_every_problem_is_reported_in_field_order() -> None:
    problems = problems_of({"item": 7, "quantity": 0, "address": {"city": "York"}})

    assert problems == (
        "item: 7 is not of type 'string'",
        "quantity: 0 is less than the minimum of 1",
    )


@pytest.mark.parametrize("arguments", [["book", 2], "book", None, 3])
def test_arguments_that_are_not_an_object_are_refused(arguments: Any) -> None:
    assert problems_of(arguments) == (
        f"arguments must be an object, got {type(arguments).__name__}",
    )


def test_oversized_arguments_are_refused_naming_the_limit_and_its_variable() -> None:
    (problem,) = problems_of({**GOOD, "note": "x" * 500}, max_bytes=200)

    assert problem.startswith("arguments are ")
    assert "bytes of JSON; the limit is 200 (TOOLEXEC_MAX_ARGUMENT_BYTES)" in problem


def test_a_datetime_in_a_string_field_is_named() -> None:
    (problem,) = problems_of({**GOOD, "item": datetime.datetime(2025, 1, 1)})

    assert problem.startswith("item: datetime.datetime(2025, 1, 1, 0, 0) is not of type 'string'")


def test_a_datetime_where_any_json_is_allowed_is_named_by_its_path() -> None:
    (problem,) = problems_of({**GOOD, "note": {"when": [datetime.datetime(2025, 1, 1)]}})

    assert problem.startswith("note.when.0: not a JSON value")
    assert "datetime" in problem


def test_nan_in_a_number_field_is_named() -> None:
    (problem,) = problems_of({**GOOD, "weight": math.nan})

    assert problem.startswith("weight: not a JSON value")


def test_a_circular_value_is_refused_without_recursing_forever() -> None:
    looped: list[Any] = []
    looped.append(looped)

    (problem,) = problems_of({**GOOD, "note": looped})

    assert problem.startswith("note.0: not a JSON value")


def test_invalid_arguments_belong_to_the_remote_tool_error_tree() -> None:
    assert issubclass(ToolArgumentsInvalid, RemoteToolError)
