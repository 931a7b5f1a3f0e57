"""Deadlines: the "not set" sentinel and the precedence of timeouts.

Precedence, highest first: a timeout given to one call, to ``remote_tool(timeout=)``,
the framework's default (LazyBridge's ``Agent(tool_timeout=)``, ...), the toolset's
``remote_tools(default_timeout=)``, the tool's own ``@tool(timeout=)``, the settings
default (see ``RemoteTool.effective_timeout``).
``None`` at any level means "no deadline" and wins like any other value; only
:data:`NOT_SET` defers to the next level.

A deadline counts from when the call was made: a caller that does work of its own
first (the MCP server reading the catalog for a tool it had not seen) passes that
moment on as ``started``, and :func:`time_left` says what remains.
"""

from __future__ import annotations

import enum
import math
import time
from typing import Final, TypeAlias

__all__ = ["NOT_SET", "NotSet", "Timeout", "check_timeout", "resolve_timeout", "time_left"]


class NotSet(enum.Enum):
    """Type of :data:`NOT_SET`."""

    NOT_SET = "NOT_SET"

    def __repr__(self) -> str:
        return "NOT_SET"


#: "Use the next level's value": distinct from ``None``, which means no deadline.
NOT_SET: Final = NotSet.NOT_SET

Timeout: TypeAlias = "float | None | NotSet"


def check_timeout(value: Timeout, *, what: str = "timeout") -> Timeout:
    """Return ``value`` if it is NOT_SET, None or a positive finite number; else raise."""
    if value is NOT_SET or value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, None (no deadline) or NOT_SET; got {value!r}")
    return float(value)


def resolve_timeout(*levels: Timeout) -> float | None:
    """The first level that is set, highest first; None (no deadline) if none is."""
    for level in levels:
        if level is not NOT_SET:
            return None if level is None else float(level)
    return None


def time_left(timeout: float | None, started: float | None) -> float | None:
    """Seconds left of ``timeout`` counted from ``started`` (a ``time.monotonic()`` reading).

    None means no deadline; ``started`` None counts from now. Zero or less: it passed.
    """
    if timeout is None or started is None:
        return timeout
    return timeout - (time.monotonic() - started)
