"""Hypothesis strategies for arguments a model (or a forged message) may send a tool.

Shared by the client-side and worker-side fuzz tests. :data:`STARTER_TOOLS` is what
``import tasks`` registers, read from the registry. For each tool there are valid
arguments built from its published JSON Schema (:func:`valid_arguments`), and for each
category of bad input (:data:`CATEGORIES`: wrong types, missing and extra fields, huge
strings, deep nesting, NaN and Infinity, lone surrogates) a case that spoils one field
and says which (:class:`BadCase`). A tool without fields of its own gets each spoiled
value in a field it does not declare. Sizes are drawn as numbers and built directly,
so a megabyte string costs no shrinking.

:func:`assert_schema_valid_json` is the strict check of whatever a side accepted: JSON
without NaN or Infinity, every string (keys too) valid Unicode, nesting bounded, and
valid against the tool's published schema by an independent validator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from jsonschema import Draft202012Validator

import tasks
from executor.registry import ToolDefinition, get_tool, registered_tools

__all__ = [
    "CATEGORIES",
    "MAX_DEPTH",
    "STARTER_TOOLS",
    "BadCase",
    "assert_schema_valid_json",
    "field_named",
    "hostile_values",
    "mixed_arguments",
    "starter",
    "valid_arguments",
]

#: Every tool ``import tasks`` registers (``tasks.__all__`` also lists a plain function).
STARTER_TOOLS = tuple(
    sorted(
        name
        for name, definition in registered_tools().items()
        if definition.func.__module__.split(".")[0] == tasks.__name__
    )
)
#: The deepest nesting accepted arguments may have; the starter tools take flat values.
MAX_DEPTH = 2


def starter(name: str) -> ToolDefinition:
    """The registered definition of a starter tool."""
    definition = get_tool(name)
    assert definition is not None, name
    return definition


def _properties(definition: ToolDefinition) -> dict[str, dict[str, Any]]:
    properties: dict[str, dict[str, Any]] = definition.spec.parameters.get("properties", {})
    return properties


# -- valid arguments, from the published schema ------------------------------------------


def _valid_value(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = schema.get("type")
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength", 50)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: low <= len(s) <= high
            )
        # Without surrounding white space: a tool may strip it (book_flight's passenger
        # does), which its JSON Schema cannot say, so "  " passes the client's check only.
        text = st.text(st.characters(codec="utf-8"), min_size=max(low, 1), max_size=min(high, 50))
        return text.filter(lambda s: s == s.strip() and len(s) >= low)
    if kind == "integer":
        return st.integers(schema.get("minimum", -(2**31)), schema.get("maximum", 2**31))
    if kind == "number":
        floor = schema.get("exclusiveMinimum", schema.get("minimum", -1e9))
        return st.floats(
            floor, schema.get("maximum", 1e9), exclude_min="exclusiveMinimum" in schema
        )
    if kind == "boolean":
        return st.booleans()
    raise NotImplementedError(
        f"a starter tool's schema uses {schema!r}: teach fuzz_strategies to build it"
    )


def valid_arguments(definition: ToolDefinition) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments that fit ``definition``'s schema: every required field, some optional ones."""
    properties = _properties(definition)
    required = set(definition.spec.parameters.get("required", []))
    return st.fixed_dictionaries(
        {name: _valid_value(schema) for name, schema in properties.items() if name in required},
        optional={
            name: _valid_value(schema)
            for name, schema in properties.items()
            if name not in required
        },
    )


# -- hostile values ------------------------------------------------------------------------


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


_LONE_SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
_WITH_SURROGATE = st.builds(
    lambda a, s, b: a + s + b, st.text(max_size=5), _LONE_SURROGATE, st.text(max_size=5)
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | _WITH_SURROGATE
)
#: Lengths around the limits: a field's maximum, the 1 MiB argument limit, and past it.
_HUGE_LENGTHS = st.sampled_from([501, 1_000, 1_048_577, 2_000_000])
_DEPTHS = st.sampled_from([30, 1_100, 3_000])


def hostile_values() -> st.SearchStrategy[Any]:
    """Any value a field may be sent: scalars, huge strings, containers, deep nesting."""
    return st.one_of(
        _SCALARS,
        _HUGE_LENGTHS.map(lambda n: "x" * n),
        st.lists(_SCALARS, max_size=4),
        st.dictionaries(st.text(max_size=8), _SCALARS, max_size=4),
        st.builds(_nested, _DEPTHS, _SCALARS),
    )


def mixed_arguments(definition: ToolDefinition) -> st.SearchStrategy[dict[str, Any]]:
    """Valid arguments with any of their fields replaced, left out, or joined by extras."""
    names = sorted(_properties(definition))
    fields = st.fixed_dictionaries({}, optional={name: hostile_values() for name in names})
    extras = st.dictionaries(
        st.text(max_size=12).filter(lambda k: k not in names), hostile_values(), max_size=3
    )
    return st.builds(
        lambda valid, known, more: {**valid, **known, **more},
        valid_arguments(definition),
        fields,
        extras,
    )


# -- one bad field per case, by category ------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BadCase:
    """Arguments with one field spoiled, and that field's name."""

    arguments: dict[str, Any]
    field: str


def field_named(field: str) -> str:
    """How an error message names ``field``: lone surrogates escaped (``\\ud800``)."""
    return field.encode("utf-8", "backslashreplace").decode("utf-8")


_UNDECLARED = st.text(st.characters(codec="ascii", categories=["L"]), min_size=1, max_size=12)


def _target(
    data: st.DataObject, definition: ToolDefinition, kinds: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """A declared field (of one of ``kinds``, if given) and valid arguments around it;
    or an undeclared one."""
    candidates = sorted(
        n for n, s in _properties(definition).items() if not kinds or s.get("type") in kinds
    )
    base = data.draw(valid_arguments(definition))
    if candidates:
        return data.draw(st.sampled_from(candidates)), base
    return data.draw(_UNDECLARED.filter(lambda name: name not in _properties(definition))), base


def _wrong_type(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    # Values neither side takes for the field: none of JSON Schema's type, and none
    # pydantic coerces into it (the worker coerces "5" to 5.0 by design).
    containers = st.none() | st.lists(st.integers(), min_size=1, max_size=3) | st.just({"a": 1})
    if schema.get("type") == "string":
        return containers | st.integers() | st.booleans()
    return containers | st.text(
        st.characters(codec="ascii", categories=["L"]), min_size=1, max_size=10
    )


Category = Callable[[st.DataObject, ToolDefinition], BadCase]


def _spoil(value: st.SearchStrategy[Any], kinds: tuple[str, ...] = ()) -> Category:
    def case(data: st.DataObject, definition: ToolDefinition) -> BadCase:
        field, base = _target(data, definition, kinds)
        return BadCase(arguments={**base, field: data.draw(value)}, field=field)

    return case


def _wrong_types(data: st.DataObject, definition: ToolDefinition) -> BadCase:
    field, base = _target(data, definition)
    return BadCase(
        arguments={**base, field: data.draw(_wrong_type(_properties(definition).get(field, {})))},
        field=field,
    )


def _missing(data: st.DataObject, definition: ToolDefinition) -> BadCase:
    required = sorted(definition.spec.parameters.get("required", []))
    assert required, f"{definition.name} requires nothing: the missing category does not apply"
    field = data.draw(st.sampled_from(required))
    base = data.draw(valid_arguments(definition))
    return BadCase(arguments={k: v for k, v in base.items() if k != field}, field=field)


def _extra(data: st.DataObject, definition: ToolDefinition) -> BadCase:
    base = data.draw(valid_arguments(definition))
    field = data.draw(_UNDECLARED.filter(lambda name: name not in _properties(definition)))
    return BadCase(arguments={**base, field: data.draw(_SCALARS)}, field=field)


_LETTERS = st.text(st.characters(codec="ascii", categories=["L"]), max_size=5)


def _surrogate_key(data: st.DataObject, definition: ToolDefinition) -> BadCase:
    base = data.draw(valid_arguments(definition))
    field = data.draw(st.builds(lambda a, s, b: a + s + b, _LETTERS, _LONE_SURROGATE, _LETTERS))
    return BadCase(arguments={**base, field: 1}, field=field)


def _surrogates(data: st.DataObject, definition: ToolDefinition) -> BadCase:
    if data.draw(st.booleans()):
        return _surrogate_key(data, definition)
    return _spoil(_WITH_SURROGATE, ("string",))(data, definition)


#: Each category of bad input: draws a case for a tool.
CATEGORIES: dict[str, Category] = {
    "wrong types": _wrong_types,
    "missing fields": _missing,
    "extra fields": _extra,
    "huge strings": _spoil(_HUGE_LENGTHS.map(lambda n: "x" * n)),
    "deep nesting": _spoil(st.builds(_nested, _DEPTHS, st.just("leaf"))),
    "NaN and Infinity": _spoil(st.sampled_from([math.nan, math.inf, -math.inf])),
    "lone surrogates": _surrogates,
}


# -- what an accepting side must have accepted -----------------------------------------------


def _refuse_constant(constant: str) -> Any:
    raise AssertionError(f"{constant} is not JSON")


def assert_schema_valid_json(value: Any, definition: ToolDefinition) -> None:
    """``value`` (decoded arguments) is strict JSON that fits the tool's published schema."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        assert depth <= MAX_DEPTH, f"accepted arguments nest {depth} deep"
        if isinstance(item, str):
            item.encode("utf-8")  # UnicodeEncodeError: a lone surrogate was accepted
        elif isinstance(item, float):
            assert math.isfinite(item), f"{item} was accepted"
        elif isinstance(item, dict):
            stack.extend((key, depth + 1) for key in item)
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        else:
            assert item is None or isinstance(item, bool | int), (
                f"{type(item).__name__} is not JSON"
            )
    text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    assert json.loads(text, parse_constant=_refuse_constant) == value
    errors = [
        e.message for e in Draft202012Validator(definition.spec.parameters).iter_errors(value)
    ]
    assert not errors, f"accepted arguments that do not fit the schema: {errors}"
