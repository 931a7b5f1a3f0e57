"""Check a call's arguments against the tool's JSON Schema before anything is sent.

A validator is compiled once per schema. A bad call raises
:class:`~agent_client.errors.ToolArgumentsInvalid` naming each offending field, and
costs no round trip. Valid calls (nearly all) pass through a schema compiled to Python
by fastjsonschema, several times faster than walking it; only a call it rejects is
walked again by jsonschema (Draft 2020-12), which names every offending field.

Models send a tool call's arguments as a JSON string; :func:`parse_arguments` reads one
strictly (one object, no NaN, no repeated key) into the dict the validator checks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import fastjsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from agent_client.errors import ToolArgumentsInvalid
from wire.depth import MAX_DEPTH, too_deep
from wire.message import ArgumentsNotJSON, encode_arguments

__all__ = ["ArgumentValidator", "parse_arguments"]


def parse_arguments(tool: str, text: str | bytes | bytearray) -> dict[str, Any]:
    """A model's arguments string as the dict of arguments; empty or blank means none.

    Raises:
        ToolArgumentsInvalid: The text is not UTF-8, not JSON, not one JSON object, holds
            NaN or Infinity, names a key twice, or nests too deeply; the message says which.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolArgumentsInvalid(
                tool, [f"arguments are not UTF-8 text ({exc.reason} at byte {exc.start})"]
            ) from None
    if not text.strip():
        return {}
    constants: list[_Constant] = []
    try:
        parsed = json.loads(
            text,
            parse_constant=functools.partial(_constant, constants),
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise ToolArgumentsInvalid(
            tool, [f"arguments are not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"]
        ) from None
    except _Refused as exc:
        raise ToolArgumentsInvalid(tool, [str(exc)]) from None
    except RecursionError:
        raise ToolArgumentsInvalid(tool, [_TOO_DEEP]) from None
    if constants:
        where = _path_of(parsed, lambda value: isinstance(value, _Constant))
        raise ToolArgumentsInvalid(tool, [f"{where}: {constants[0]} is not a JSON number"])
    if not isinstance(parsed, dict):
        raise ToolArgumentsInvalid(
            tool, [f"arguments must be a JSON object, got {type(parsed).__name__}"]
        )
    return parsed


class _Refused(ValueError):
    pass


class _Constant(str):
    """A NaN or Infinity of an arguments text, kept until its field is named."""


def _constant(found: list[_Constant], constant: str) -> _Constant:
    found.append(_Constant(constant))
    return found[-1]


def _path_of(value: Any, wanted: Callable[[Any], bool]) -> str:
    """The dotted path of the first item of ``value`` that is ``wanted`` (walked without
    recursion)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    seen: set[int] = set()
    while stack:
        item, path = stack.pop()
        if wanted(item):
            return _printable(".".join(str(p) for p in path)) or "(arguments)"
        if isinstance(item, dict | list | tuple) and id(item) not in seen:
            seen.add(id(item))
            children = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend(reversed([(child, (*path, key)) for key, child in children]))
    return "(arguments)"


def _depth(value: Any) -> int:
    """How deep ``value`` nests, counted without recursion (each container once)."""
    deepest, stack, seen = 0, [(value, 0)], set()
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict | list | tuple) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _too_deep(arguments: dict[str, Any]) -> str:
    """Name the field nested deeper than :data:`wire.depth.MAX_DEPTH`: the one to fix."""
    if not arguments:
        return _TOO_DEEP
    field = max(arguments, key=lambda name: _depth(arguments[name]))
    return f"{_printable(str(field))}: nested deeper than {MAX_DEPTH} levels of arrays and objects"


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``): the message goes back as JSON."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _Refused(f"{twice}: named more than once in the arguments")
    return found


class ArgumentValidator:
    """The compiled validator of one tool's parameters."""

    def __init__(self, tool: str, schema: dict[str, Any], *, max_bytes: int) -> None:
        self._tool = tool
        self._validator = Draft202012Validator(schema)
        self._max_bytes = max_bytes
        try:
            self._fast: Callable[[Any], Any] | None = fastjsonschema.compile(schema)
        except Exception:  # noqa: BLE001 - a schema it cannot compile takes the full path
            self._fast = None

    def _passes_fast(self, arguments: Any) -> bool:
        if self._fast is None:
            return False
        try:
            self._fast(arguments)
        except Exception:  # noqa: BLE001 - a rejection, or a value it cannot handle: full path
            return False
        return True

    def check(self, arguments: Any) -> bytes:
        """Raise :class:`ToolArgumentsInvalid` unless ``arguments`` fit the schema.

        Returns:
            The arguments encoded as the JSON that goes on the wire (encoded once,
            here, where its size is checked).
        """
        if not isinstance(arguments, dict):
            raise ToolArgumentsInvalid(
                self._tool, [f"arguments must be an object, got {type(arguments).__name__}"]
            )
        if not self._passes_fast(arguments):
            try:
                errors = sorted(
                    self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)
                )
            except RecursionError:
                raise ToolArgumentsInvalid(self._tool, [_too_deep(arguments)]) from None
            if errors:
                raise ToolArgumentsInvalid(self._tool, _problems(errors))
        try:
            encoded = encode_arguments(arguments)
        except ArgumentsNotJSON as exc:
            raise ToolArgumentsInvalid(
                self._tool, [_printable(_not_json(arguments, exc))]
            ) from None
        except RecursionError:
            raise ToolArgumentsInvalid(self._tool, [_too_deep(arguments)]) from None
        if len(encoded) > self._max_bytes:
            raise ToolArgumentsInvalid(
                self._tool,
                [
                    (
                        f"arguments are {len(encoded)} bytes of JSON; the limit is "
                        f"{self._max_bytes} (TOOLEXEC_MAX_ARGUMENT_BYTES)"
                    )
                ],
            )
        if too_deep(encoded, around=1):  # the arguments' own object is not counted
            raise ToolArgumentsInvalid(self._tool, [_too_deep(arguments)])
        if b'"__type__"' in encoded:  # rare: only then walk the arguments
            marked = _kombu_marker(arguments, ())
            if marked is not None:
                where = _printable(".".join(str(p) for p in marked)) or "(arguments)"
                raise ToolArgumentsInvalid(self._tool, [f"{where}: {_RESERVED}"])
        return encoded


_TOO_DEEP = f"arguments are nested deeper than {MAX_DEPTH} levels of arrays and objects"
_RESERVED = (
    "an object whose only keys are __type__ and __value__ is reserved: the worker's JSON "
    "decoder (kombu) would turn it into a Python object; rename its keys"
)


def _kombu_marker(value: Any, path: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Where ``value`` holds an object kombu's JSON decoder reads as a typed value."""
    if isinstance(value, dict):
        if value.keys() == {"__type__", "__value__"}:
            return path
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _kombu_marker(item, (*path, key))
        if found is not None:
            return found
    return None


#: A problem's text is cut to this many characters, and at most this many are listed:
#: jsonschema quotes the offending value, which may be a megabyte string.
_MAX_PROBLEM_CHARS = 200
_MAX_PROBLEMS = 8


def _problems(errors: list[ValidationError]) -> list[str]:
    problems = [_describe(e) for e in errors[:_MAX_PROBLEMS]]
    if len(errors) > _MAX_PROBLEMS:
        problems.append(f"and {len(errors) - _MAX_PROBLEMS} more")
    return problems


def _describe(error: ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    text = _printable(f"{path}: {error.message}" if path else error.message)
    return text if len(text) <= _MAX_PROBLEM_CHARS else text[: _MAX_PROBLEM_CHARS - 1] + "…"


def _not_json(arguments: dict[str, Any], exc: Exception) -> str:
    """Name the first value JSON cannot carry, so the model knows which field to fix."""
    try:
        found = _find_not_json(arguments, (), set())
    except RecursionError:
        found = None
    if found is None:
        return f"arguments are not JSON: {exc}"
    where = ".".join(str(p) for p in found) or "(arguments)"
    return f"{where}: not a JSON value ({exc})"


def _find_not_json(value: Any, path: tuple[Any, ...], seen: set[int]) -> tuple[Any, ...] | None:
    if isinstance(value, dict | list | tuple):
        if id(value) in seen:
            return path  # a circular reference
        seen = seen | {id(value)}
        if isinstance(value, dict):
            if not all(isinstance(k, str | int | float | bool) or k is None for k in value):
                return path
            items: Any = value.items()
        else:
            items = enumerate(value)
        for key, item in items:
            found = _find_not_json(item, (*path, key), seen)
            if found is not None:
                return found
        return None
    try:
        encode_arguments({"": value})
    except ArgumentsNotJSON:
        return path
    return None
