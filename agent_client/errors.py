"""Errors a remote tool call raises in the agent process.

```
RemoteToolError
├── ToolNotFound            no live worker serves that tool
├── ToolArgumentsInvalid    the model's arguments do not fit the schema
├── ToolExecutionError      the tool raised (remote type and message kept)
├── ToolTimeoutError        the deadline passed; the caller stopped waiting
├── WorkerLost              the worker died while running the call
├── ToolOutcomeUnknown      the call may have run, and no reply came in time (or Redis lost it)
└── BrokerUnavailable       Redis or the broker cannot be reached; the call was not sent
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
    "ToolOutcomeUnknown",
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


class ToolOutcomeUnknown(RemoteToolError):
    """A write of the call may have reached Redis, and no reply came by the deadline.

    The connection failed (or Redis stalled) after the call was written, and Redis never
    answered again in time: the call may have been queued and the tool may have run, or
    may still run. It is not :class:`BrokerUnavailable`, so code that retries on that
    error does not send a side effect twice; check whether it happened before retrying
    (a retry of an idempotent call in the same run joins or returns the first one).

    It is also raised before the deadline (``timeout`` None) when the client finds the
    call gone from Redis unanswered while no worker that could have taken it died: Redis
    lost it, or its outcome, in a restart.

    Attributes:
        timeout: The deadline in seconds that passed; None when it was raised before.
    """

    def __init__(self, tool: str, timeout: float | None, *, reason: str = "") -> None:
        self.timeout = timeout
        if timeout is None:
            super().__init__(
                f"tool {tool!r}: the outcome is unknown: {reason or 'the call was lost'}; "
                "check before retrying a side effect",
                tool=tool,
            )
            return
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"tool {tool!r}: the outcome is unknown: the call may have reached Redis{why}, and no "
            f"reply came within {timeout:g}s; it may have run, so check before retrying a side effect",
            tool=tool,
        )


class BrokerUnavailable(RemoteToolError):
    """Redis or the broker cannot be reached; the call was not sent, so a retry is safe."""
