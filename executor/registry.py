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
from executor.retries import DEFAULT_BACKOFF, NO_RETRIES, RetryPolicy, retry_policy
from executor.schema import function_schema
from wire.models import MAX_TIMEOUT, Delivery, ToolSpec

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
    "requires_approval",
    "on_abandon",
    "cancel_grace",
    "retries",
    "retry_on",
    "retry_backoff",
    "log_arguments",
)


@dataclass(frozen=True, kw_only=True)
class ToolDefinition:
    """A registered tool: the callable, its argument model and its published spec."""

    func: Callable[..., Any]
    spec: ToolSpec
    model: type[BaseModel]
    is_async: bool
    #: How the worker retries a failed attempt (``retries``, ``retry_on``, ``retry_backoff``).
    retry: RetryPolicy = NO_RETRIES
    #: Whether its calls' arguments and results go into their run's event log
    #: (``@tool(log_arguments=True)``, :mod:`wire.runlog`); never by default.
    log_arguments: bool = False

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
            at-least-once for idempotent tools, at-most-once otherwise),
            ``cache_errors`` (store a failed outcome of an idempotent tool too) and
            ``requires_approval`` (default False; True: a person approves each call
            before it is sent, in the agent framework's own way), ``on_abandon``
            (``"leave"``, the default: a caller that stops waiting leaves the call to
            run on; ``"cancel"``: its caller's deadline or cancellation cancels the
            call), ``cancel_grace`` (seconds a cancelled call's tool has to unwind,
            default 1.0), ``retries`` (default 0: attempts the worker makes after the
            first when the tool raises, each started only if it can end before the
            call's deadline; :mod:`executor.retries`), ``retry_on`` (the exception types
            retried: a class or a tuple; required with ``retries`` on an at-most-once
            tool, else ``(Exception,)``), ``retry_backoff`` (seconds before the first
            retry, doubling for each after, with jitter; default 0.5) and
            ``log_arguments`` (default False; True: each call's arguments and result go
            into its run's event log, which ``toolexec ui`` shows, :mod:`wire.runlog`).

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
    requires_approval: bool = False,
    on_abandon: str = "leave",
    cancel_grace: float = 1.0,
    retries: int = 0,
    retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
    retry_backoff: float = DEFAULT_BACKOFF,
    log_arguments: bool = False,
) -> ToolDefinition:
    name = name if name is not None else getattr(fn, "__name__", "")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolDefinitionError(
            f"invalid tool name {name!r}: use 1-64 letters, digits, '_' or '-', starting with a "
            "letter"
        )
    if not isinstance(queue, str) or not _QUEUE.match(queue):
        raise ToolDefinitionError(f"tool {name!r}: invalid queue name {queue!r}")
    for option, value in (("timeout", timeout), ("hard_timeout", hard_timeout)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ToolDefinitionError(
                f"tool {name!r}: {option} must be a positive number of seconds or None, got "
                f"{value!r}"
            )
        if value is not None and value > MAX_TIMEOUT:
            raise ToolDefinitionError(
                f"tool {name!r}: {option} must be at most {MAX_TIMEOUT:.0f} seconds (366 days), "
                f"got {value!r}"
            )
    if delivery is None:
        delivery = "at_least_once" if idempotent else "at_most_once"
    if delivery not in ("at_most_once", "at_least_once"):
        raise ToolDefinitionError(
            f"tool {name!r}: delivery must be 'at_most_once' or 'at_least_once', got {delivery!r}"
        )
    if not isinstance(requires_approval, bool):
        raise ToolDefinitionError(
            f"tool {name!r}: requires_approval must be True or False, got {requires_approval!r}"
        )
    if on_abandon not in ("leave", "cancel"):
        raise ToolDefinitionError(
            f"tool {name!r}: on_abandon must be 'leave' or 'cancel', got {on_abandon!r}"
        )
    if (
        isinstance(cancel_grace, bool)
        or not isinstance(cancel_grace, int | float)
        or not math.isfinite(cancel_grace)
        or not 0 <= cancel_grace <= 3600
    ):
        raise ToolDefinitionError(
            f"tool {name!r}: cancel_grace must be a number of seconds from 0 to 3600, got "
            f"{cancel_grace!r}"
        )
    if not isinstance(log_arguments, bool):
        raise ToolDefinitionError(
            f"tool {name!r}: log_arguments must be True or False, got {log_arguments!r}"
        )
    if cache_errors and not idempotent:
        raise ToolDefinitionError(f"tool {name!r}: cache_errors=True needs idempotent=True")
    retry = retry_policy(
        name, retries=retries, retry_on=retry_on, retry_backoff=retry_backoff, delivery=delivery
    )
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
        requires_approval=requires_approval,
        on_abandon="cancel" if on_abandon == "cancel" else "leave",
        cancel_grace=float(cancel_grace),
        retries=retry.retries,
        retry_backoff=retry.backoff,
    )
    return ToolDefinition(
        func=fn,
        spec=spec,
        model=schema.model,
        is_async=schema.is_async,
        retry=retry,
        log_arguments=log_arguments,
    )


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
