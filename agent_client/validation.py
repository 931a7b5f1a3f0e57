"""Check a call's arguments against the tool's JSON Schema before anything is sent.

A validator is compiled once per schema. A bad call raises
:class:`~agent_client.errors.ToolArgumentsInvalid` naming each offending field, and
costs no round trip. Valid calls (nearly all) pass through a schema compiled to Python
by fastjsonschema, several times faster than walking it; only a call it rejects is
walked again by jsonschema (Draft 2020-12), which names every offending field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import fastjsonschema

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from agent_client.errors import ToolArgumentsInvalid

__all__ = ["ArgumentValidator"]


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

    def check(self, arguments: Any) -> None:
        """Raise :class:`ToolArgumentsInvalid` unless ``arguments`` fit the schema."""
        if not isinstance(arguments, dict):
            raise ToolArgumentsInvalid(self._tool, [f"arguments must be an object, got {type(arguments).__name__}"])
        if not self._passes_fast(arguments):
            errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
            if errors:
                raise ToolArgumentsInvalid(self._tool, [_describe(e) for e in errors])
        try:
            size = len(json.dumps(arguments, separators=(",", ":"), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ToolArgumentsInvalid(self._tool, [_not_json(arguments, exc)]) from None
        if size > self._max_bytes:
            raise ToolArgumentsInvalid(
                self._tool,
                [f"arguments are {size} bytes of JSON; the limit is {self._max_bytes} (TOOLEXEC_MAX_ARGUMENT_BYTES)"],
            )


def _describe(error: ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    return f"{path}: {error.message}" if path else error.message


def _not_json(arguments: dict[str, Any], exc: Exception) -> str:
    """Name the first value JSON cannot carry, so the model knows which field to fix."""
    found = _find_not_json(arguments, (), set())
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
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return path
    return None
