"""Fuzzing the client's argument check with every starter tool's published schema.

Whatever a model sends (wrong types, missing and extra fields, huge strings, deep
nesting, NaN and Infinity, lone surrogates, or an arguments string that is not JSON),
the client either sends strict JSON that fits the schema or raises
:class:`ToolArgumentsInvalid` with a short message that names the field: never another
exception, never a traceback. Every category is tried on every starter tool.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tasks
from agent_client import ToolArgumentsInvalid
from agent_client.validation import ArgumentValidator, parse_arguments
from executor.registry import get_tool
from tests.unit.fuzz_strategies import (
    CATEGORIES,
    STARTER_TOOLS,
    assert_schema_valid_json,
    field_named,
    hostile_values,
    mixed_arguments,
    starter,
    valid_arguments,
)
from wire.settings import Settings

MAX_BYTES = Settings.from_env({}).max_argument_bytes
#: The longest error message a model is shown.
MAX_MESSAGE = 2_000

_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=_HEALTH)
#: Per category and tool: enough to draw each of a category's variants several times.
PER_CASE = settings(max_examples=12, deadline=None, suppress_health_check=_HEALTH)


@functools.cache
def validator(name: str) -> ArgumentValidator:
    """The client's validator of a starter tool, built from its published schema."""
    spec = starter(name).spec
    return ArgumentValidator(spec.name, spec.parameters, max_bytes=MAX_BYTES)


def assert_clear(exc: ToolArgumentsInvalid, tool: str) -> str:
    """A message for the model: names the tool, short, valid Unicode, no traceback."""
    message = str(exc)
    assert message.startswith(f"invalid arguments for tool {tool!r}: ")
    assert len(message) <= MAX_MESSAGE, f"{len(message)} characters"
    message.encode("utf-8")  # a lone surrogate quoted back would break the model's JSON
    assert "Traceback" not in message and 'File "' not in message
    assert exc.problems
    return message


def test_the_fuzzed_tools_are_every_tool_the_starter_catalogue_registers() -> None:
    registered = {name for name in tasks.__all__ if get_tool(name) is not None}

    assert STARTER_TOOLS, "no starter tools registered"
    assert (
        set(STARTER_TOOLS)
        == registered
        == {"book_flight", "get_today_date", "search", "slow_report"}
    )


@FUZZ
@given(data=st.data())
def test_the_client_sends_strict_json_that_fits_the_schema_or_says_clearly_what_is_wrong(
    data: st.DataObject,
) -> None:
    tool = data.draw(st.sampled_from(STARTER_TOOLS))
    arguments = data.draw(mixed_arguments(starter(tool)))
    try:
        encoded = validator(tool).check(arguments)
    except ToolArgumentsInvalid as exc:
        assert_clear(exc, tool)
        return
    assert len(encoded) <= MAX_BYTES
    assert_schema_valid_json(json.loads(encoded), starter(tool))


@pytest.mark.parametrize("tool", STARTER_TOOLS)
@FUZZ
@given(data=st.data())
def test_valid_arguments_are_sent_as_they_are(tool: str, data: st.DataObject) -> None:
    arguments = data.draw(valid_arguments(starter(tool)))

    assert json.loads(validator(tool).check(arguments)) == arguments


@pytest.mark.parametrize("tool", STARTER_TOOLS)
@pytest.mark.parametrize("category", sorted(CATEGORIES))
@PER_CASE
@given(data=st.data())
def test_each_category_of_bad_argument_is_refused_naming_its_field(
    category: str, tool: str, data: st.DataObject
) -> None:
    if category == "missing fields" and not starter(tool).spec.parameters.get("required"):
        # Nothing can be missing: the tool requires no field, and no arguments are valid.
        assert json.loads(validator(tool).check({})) == {}
        return
    case = CATEGORIES[category](data, starter(tool))

    with pytest.raises(ToolArgumentsInvalid) as refused:
        validator(tool).check(case.arguments)

    assert field_named(case.field) in assert_clear(refused.value, tool)


@FUZZ
@given(tool=st.sampled_from(STARTER_TOOLS), value=hostile_values())
def test_arguments_that_are_not_an_object_are_refused_clearly(tool: str, value: Any) -> None:
    if isinstance(value, dict):
        return
    with pytest.raises(ToolArgumentsInvalid) as refused:
        validator(tool).check(value)
    assert "arguments must be an object" in assert_clear(refused.value, tool)


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ({"query": "fox", "extra": {"__type__": "bytes", "__value__": "fox"}}, "extra"),
        ({"query": "fox", "extra": [1, {"__type__": "nope", "__value__": 1}]}, "extra.1"),
    ],
)
def test_an_object_kombus_json_would_decode_as_a_python_type_is_refused(
    arguments: dict[str, Any], where: str
) -> None:
    schema = {"type": "object", "properties": {"query": {"type": "string"}}}  # extra fields allowed
    with pytest.raises(
        ToolArgumentsInvalid, match=f"{where}: an object whose only keys are __type__ and __value__"
    ):
        ArgumentValidator("loose", schema, max_bytes=MAX_BYTES).check(arguments)
    # Only exactly those two keys are kombu's marker: a third key makes it plain data.
    plain = {"query": "fox", "extra": {"__type__": "bytes", "__value__": "fox", "note": 1}}
    assert json.loads(ArgumentValidator("loose", schema, max_bytes=MAX_BYTES).check(plain)) == plain


# -- an arguments string, as a model's tool call carries it -------------------------------


def _spoiled_texts(valid: str) -> st.SearchStrategy[tuple[str, str]]:
    """Texts a model may send instead of ``valid`` (a JSON object), with what the refusal names."""
    spoiled = [
        (valid + " and more", "not JSON"),
        (valid.replace("{", "{,", 1), "not JSON"),
        (f"[{valid}]", "a JSON object"),
        ("null", "a JSON object"),
    ]
    if '"' in valid:
        spoiled.append((valid.replace('"', "'"), "not JSON"))
    cut = st.integers(1, len(valid) - 1).map(lambda n: (valid[:n], "not JSON"))
    return cut | st.sampled_from(spoiled)


@pytest.mark.parametrize("tool", STARTER_TOOLS)
@PER_CASE
@given(data=st.data())
def test_an_arguments_text_that_is_not_json_is_refused_saying_where(
    tool: str, data: st.DataObject
) -> None:
    valid = json.dumps(data.draw(valid_arguments(starter(tool))))
    text, problem = data.draw(_spoiled_texts(valid))

    with pytest.raises(ToolArgumentsInvalid, match=problem) as refused:
        parse_arguments(tool, text)

    message = assert_clear(refused.value, tool)
    assert "line 1, column" in message or "got" in message


@pytest.mark.parametrize("tool", STARTER_TOOLS)
@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_an_arguments_text_with_nan_or_infinity_names_the_field(tool: str, constant: str) -> None:
    field = next(iter(starter(tool).spec.parameters.get("properties", {})), "unexpected")

    with pytest.raises(ToolArgumentsInvalid, match=constant) as refused:
        parse_arguments(tool, f'{{"{field}": {constant}}}')

    assert f"{field}: " in assert_clear(refused.value, tool)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", None),
        ("  ", None),
        ('{"query": "fox"}', None),
        ("{query: fox}", "not JSON"),
        ('{"query": "a", "query": "b"}', "query: named more than once"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 100 levels"),
        (b'{"query": "\xff"}', "UTF-8"),
    ],
)
def test_a_models_arguments_string_is_parsed_strictly(
    text: str | bytes, problem: str | None
) -> None:
    if problem is None:
        parsed = parse_arguments("search", text)
        assert parsed == (json.loads(text) if str(text).strip() else {})
        return
    with pytest.raises(ToolArgumentsInvalid, match=problem) as refused:
        parse_arguments("search", text)
    assert_clear(refused.value, "search")


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200))
def test_any_arguments_string_parses_to_an_object_or_is_refused_clearly(text: str | bytes) -> None:
    try:
        parsed = parse_arguments("search", text)
    except ToolArgumentsInvalid as exc:
        assert_clear(exc, "search")
        return
    assert isinstance(parsed, dict)
