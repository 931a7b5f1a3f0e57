"""Errors a remote tool call raises in the agent process.

```
RemoteToolError
├── ToolNotFound            no live worker serves that tool
├── ToolArgumentsInvalid    the model's arguments do not fit the schema
├── ToolExecutionError      the tool raised (remote type and message kept)
├── ToolTimeoutError        the deadline passed; the caller stopped waiting
├── WorkerLost              the worker died while running the call
└── BrokerUnavailable       Redis or the broker cannot be reached
```

Each message is written to be shown to a model as it is: it names the tool and says
what went wrong.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BrokerUnavailable",
    "RemoteToolError",
    "ToolArgumentsInvalid",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolTimeoutError",
    "WorkerLost",
]


class RemoteToolError(Exception):
    """Base of every error a remote tool call raises.

    Attributes:
        tool: Name of the tool called, or None when the error concerns no single tool.
    """

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class ToolNotFound(RemoteToolError):
    """No live worker serves the tool."""

    def __init__(self, tool: str, available: Iterable[str] = (), *, reason: str = "") -> None:
        self.available = tuple(sorted(available))
        listed = ", ".join(self.available) if self.available else "none"
        why = reason or "no live worker serves it"
        super().__init__(f"tool {tool!r} is not available: {why}. Available tools: {listed}", tool=tool)


class ToolArgumentsInvalid(RemoteToolError):
    """The arguments do not fit the tool's schema; nothing was sent."""

    def __init__(self, tool: str, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"invalid arguments for tool {tool!r}: " + "; ".join(self.problems), tool=tool)


class ToolExecutionError(RemoteToolError):
    """The tool raised on the worker.

    Attributes:
        remote_type: The remote exception's type name, e.g. ``"ValueError"``.
        remote_message: The remote exception's message.
    """

    def __init__(self, tool: str, remote_type: str, remote_message: str) -> None:
        self.remote_type = remote_type
        self.remote_message = remote_message
        super().__init__(f"tool {tool!r} failed: {remote_type}: {remote_message}", tool=tool)


class ToolTimeoutError(RemoteToolError):
    """The deadline passed; the caller stopped waiting and the call was abandoned.

    Attributes:
        timeout: The deadline in seconds that passed.
    """

    def __init__(self, tool: str, timeout: float) -> None:
        self.timeout = timeout
        super().__init__(f"tool {tool!r} timed out after {timeout:g}s", tool=tool)


class WorkerLost(RemoteToolError):
    """The worker running the call died before it finished."""


class BrokerUnavailable(RemoteToolError):
    """Redis or the broker cannot be reached."""
