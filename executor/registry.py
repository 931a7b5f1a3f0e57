"""The ``@tool`` decorator and the registry of tools this process can run.

Registration fails loudly: a duplicate name, an unknown option or a signature the
schema builder cannot express raises :class:`~executor.errors.ToolDefinitionError` at
import time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from pydantic import BaseModel

from executor.errors import ToolDefinitionError
from executor.schema import function_schema
from wire.models import Delivery, ToolSpec

__all__ = ["ToolDefinition", "get_tool", "registered_tools", "tool", "unregister"]

F = TypeVar("F", bound=Callable[..., Any])

_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]{0,63}$")
_QUEUE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,99}$")
_OPTIONS = (
    "name",
    "description",
    "idempotent",
    "timeout",
    "queue",
    "hard_timeout",
    "delivery",
    "cache_errors",
)


@dataclass(frozen=True, kw_only=True)
class ToolDefinition:
    """A registered tool: the callable, its argument model and its published spec."""

    func: Callable[..., Any]
    spec: ToolSpec
    model: type[BaseModel]
    is_async: bool

    @property
    def name(self) -> str:
        """The tool's registered name."""
        return self.spec.name


_registry: dict[str, ToolDefinition] = {}


@overload
def tool(func: F, /) -> F: ...
@overload
def tool(func: None = None, /, **options: Any) -> Callable[[F], F]: ...


def tool(func: F | None = None, /, **options: Any) -> F | Callable[[F], F]:
    """Register a function as a tool that workers run.

    Use it bare (``@tool``) or with options (``@tool(idempotent=True, queue="slow")``).
    The function is returned unchanged, so it can still be called directly.

    Args:
        func: The function, when used bare.
        **options: ``name`` (default: the function's name), ``description`` (default:
            the docstring's summary), ``idempotent`` (default False; True lets repeats
            within one agent run share one execution), ``timeout`` (the tool's
            default deadline in seconds; None, the default, defers to
            ``TOOLEXEC_DEFAULT_TIMEOUT``), ``queue`` (default ``"default"``),
            ``hard_timeout`` (the worker stops the run after this many seconds),
            ``delivery`` (``"at_most_once"`` or ``"at_least_once"``; default
            at-least-once for idempotent tools, at-most-once otherwise) and
            ``cache_errors`` (store a failed outcome of an idempotent tool too).

    Raises:
        ToolDefinitionError: An unknown option, a bad value, a duplicate name or a
            signature that cannot be expressed as JSON Schema.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ToolDefinitionError(
            f"unknown @tool option(s) {', '.join(map(repr, unknown))}; "
            f"known options: {', '.join(_OPTIONS)}"
        )

    def register(fn: F) -> F:
        definition = _define(fn, **options)
        existing = _registry.get(definition.name)
        if existing is not None and existing.func is not fn:
            raise ToolDefinitionError(
                f"a tool named {definition.name!r} is already registered (by "
                f"{_where(existing.func)}); give one of them another name with @tool(name=...)"
            )
        _registry[definition.name] = definition
        return fn

    if func is not None:
        if not callable(func):
            raise ToolDefinitionError(f"@tool expects a function, got {type(func).__name__}")
        return register(func)
    return register


def _define(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool = False,
    timeout: float | None = None,
    queue: str = "default",
    hard_timeout: float | None = None,
    delivery: Delivery | None = None,
    cache_errors: bool = False,
) -> ToolDefinition:
    name = name if name is not None else getattr(fn, "__name__", "")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolDefinitionError(
            f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    if not isinstance(queue, str) or not _QUEUE.match(queue):
        raise ToolDefinitionError(f"tool {name!r}: invalid queue name {queue!r}")
    for option, value in (("timeout", timeout), ("hard_timeout", hard_timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0
        ):
            raise ToolDefinitionError(f"tool {name!r}: {option} must be a positive number of seconds or None, got {value!r}")
    if delivery is None:
        delivery = "at_least_once" if idempotent else "at_most_once"
    if delivery not in ("at_most_once", "at_least_once"):
        raise ToolDefinitionError(
            f"tool {name!r}: delivery must be 'at_most_once' or 'at_least_once', got {delivery!r}"
        )
    if cache_errors and not idempotent:
        raise ToolDefinitionError(f"tool {name!r}: cache_errors=True needs idempotent=True")
    schema = function_schema(fn, name=name, description=description)
    spec = ToolSpec(
        name=name,
        description=schema.description,
        parameters=schema.parameters,
        idempotent=bool(idempotent),
        queue=queue,
        timeout=None if timeout is None else float(timeout),
        hard_timeout=None if hard_timeout is None else float(hard_timeout),
        delivery=delivery,
        cache_errors=bool(cache_errors),
    )
    return ToolDefinition(func=fn, spec=spec, model=schema.model, is_async=schema.is_async)


def get_tool(name: str) -> ToolDefinition | None:
    """The registered tool called ``name``, or None."""
    return _registry.get(name)


def registered_tools() -> dict[str, ToolDefinition]:
    """A copy of the registry: name -> definition."""
    return dict(_registry)


def unregister(name: str) -> None:
    """Remove a tool (tests use it to register throwaway tools)."""
    _registry.pop(name, None)


def _where(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"
