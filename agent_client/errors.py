"""Errors a remote tool call raises in the agent process, and how an outcome becomes one.

```
ToolexecError                   (wire.errors: toolexec's own errors, on every side)
└── RemoteToolError             a remote tool call failed
    ├── ToolNotFound            no live worker serves that tool
    ├── ToolArgumentsInvalid    the model's arguments do not fit the schema
    ├── ToolExecutionError      the tool raised (remote type and message kept)
    ├── ToolTimeoutError        the deadline passed; the caller stopped waiting
    ├── WorkerLost              the worker died while running the call
    ├── ToolOutcomeUnknown      the call may have run, and no reply came in time (or Redis lost it)
    ├── ToolCancelled           the call was cancelled: it never started, or it was stopped
    ├── CallerGone              workers judged this caller gone and did not run the call
    └── BrokerUnavailable       Redis or the broker cannot be reached; the call was not sent
```

Each message is written to be shown to a model as it is: it names the tool and says
what went wrong.

A failure crosses the wire as data (:class:`wire.models.ErrorInfo`: its kind, the
remote type's name and message), and :func:`result_of` raises it here: ``not_found``
as ``ToolNotFound``, ``invalid_arguments`` as ``ToolArgumentsInvalid``, ``expired`` as
``ToolTimeoutError`` (or ``CallerGone``, a call shed unrun because workers judged its
caller gone: never told as a timeout, since its deadline had not passed),
``worker_lost`` as ``WorkerLost`` (or ``ToolOutcomeUnknown``, the client's watchdog's
verdict on a call Redis lost), ``cancelled`` as ``ToolCancelled``, any other
(``execution``, ``hard_timeout``) as ``ToolExecutionError``. A call whose deadline
passed with no outcome is a timeout, unless its send failed or stalled: then
:func:`deadline_error` says how far it got (``BrokerUnavailable``: not sent;
``ToolOutcomeUnknown``: maybe). ``__all__`` is the tree; the two functions are the
client's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from wire.errors import ToolexecError
from wire.models import CallOutcome, ErrorKind

__all__ = [
    "BrokerUnavailable",
    "CallerGone",
    "RemoteToolError",
    "ToolArgumentsInvalid",
    "ToolCancelled",
    "ToolExecutionError",
    "ToolNotFound",
    "ToolOutcomeUnknown",
    "ToolTimeoutError",
    "WorkerLost",
]


class RemoteToolError(ToolexecError):
    """Base of every error a remote tool call raises; one branch of toolexec's errors.

    Attributes:
        tool: Name of the tool called, or None when the error concerns no single tool.
        call_id: The id of the call the error ended: what ``toolexec cancel``, ``attach``
            and the worker's logs name it by. Set on every error of a call that was
            prepared (at its deadline, or from its outcome); None for an error raised
            before a call existed (invalid arguments, no such tool, no catalog).
    """

    call_id: str | None = None

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class ToolNotFound(RemoteToolError):
    """No live worker serves the tool."""

    def __init__(self, tool: str, available: Iterable[str] = (), *, reason: str = "") -> None:
        self.available = tuple(sorted(available))
        listed = ", ".join(self.available) if self.available else "none"
        why = reason or "no live worker serves it"
        super().__init__(
            f"tool {tool!r} is not available: {why}. Available tools: {listed}", tool=tool
        )


class ToolArgumentsInvalid(RemoteToolError):
    """The arguments do not fit the tool's schema; nothing was sent."""

    def __init__(self, tool: str, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            f"invalid arguments for tool {tool!r}: " + "; ".join(self.problems), tool=tool
        )


class ToolExecutionError(RemoteToolError):
    """The tool raised on the worker.

    Attributes:
        remote_type: The remote exception's type name, e.g. ``"ValueError"``.
        remote_message: The remote exception's message.
        attempts: How many times the worker ran the tool before it gave up: more than 1
            for a tool that retries (``@tool(retries=...)``).
    """

    def __init__(
        self, tool: str, remote_type: str, remote_message: str, *, attempts: int = 1
    ) -> None:
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.attempts = attempts
        after = f" (after {attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"tool {tool!r} failed: {remote_type}: {remote_message}{after}", tool=tool)


class ToolTimeoutError(RemoteToolError):
    """The deadline passed; the caller stopped waiting and the call was abandoned.

    Attributes:
        timeout: The deadline in seconds that passed.
    """

    def __init__(self, tool: str, timeout: float, *, reason: str = "") -> None:
        self.timeout = timeout
        super().__init__(f"tool {tool!r} {reason or f'timed out after {timeout:g}s'}", tool=tool)


class CallerGone(RemoteToolError):
    """Workers judged this call's caller gone, and did not run the call.

    A worker sheds a queued call whose caller's liveness key stayed absent for a whole
    heartbeat interval while Redis took writes (or that said its client closed): queued
    work nobody waits for never starts. A live caller hears this only when its own
    process could not write to Redis for that long while the workers could.
    """


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
            f"reply came within {timeout:g}s; it may have run, so check before retrying a side "
            "effect",
            tool=tool,
        )


class ToolCancelled(RemoteToolError):
    """The call was cancelled (``CallHandle.cancel()``, ``toolexec cancel``, or its caller
    stopped waiting for a tool with ``on_abandon="cancel"``): it never started, or it was
    stopped. No outcome of it is stored: the same call again runs again."""

    def __init__(self, tool: str, message: str = "") -> None:
        super().__init__(message or f"the call to {tool!r} was cancelled", tool=tool)


class BrokerUnavailable(RemoteToolError):
    """Redis or the broker cannot be reached; the call was not sent, so a retry is safe."""


# -- an outcome, or a deadline, as an error ---------------------------------------------


def result_of(
    tool: str, outcome: CallOutcome, *, timeout: float | None = None, available: Iterable[str] = ()
) -> Any:
    """The outcome's result, or the error it carries raised as a :class:`RemoteToolError`."""
    if outcome.ok:
        return outcome.result
    error = outcome.error
    if error is None:
        raise RemoteToolError(f"tool {tool!r} failed without an error description", tool=tool)
    if error.kind is ErrorKind.INVALID_ARGUMENTS:
        raise ToolArgumentsInvalid(tool, [error.message])
    if error.kind is ErrorKind.NOT_FOUND:
        reason = error.message
        if tool in available:  # the worker that took it lacks a tool others on its queue serve
            reason += (
                ", though other live workers serve it on its queue: every worker consuming a queue "
                "must serve the same tools (`toolexec doctor` names the workers that do not)"
            )
        raise ToolNotFound(tool, available, reason=reason)
    if error.kind is ErrorKind.WORKER_LOST:
        if error.type == ToolOutcomeUnknown.__name__:  # the client's watchdog: lost, no worker died
            raise ToolOutcomeUnknown(tool, None, reason=error.message)
        raise WorkerLost(f"tool {tool!r}: {error.message}", tool=tool)
    if error.kind is ErrorKind.EXPIRED and error.type == CallerGone.__name__:
        raise CallerGone(f"tool {tool!r} was not run: {error.message}", tool=tool)
    if error.kind is ErrorKind.EXPIRED:
        raise ToolTimeoutError(
            tool,
            timeout or 0.0,
            reason=(
                f"was not run: its {timeout or 0:g}s deadline had passed by the worker's clock "
                "before it started"
            ),
        )
    if error.kind is ErrorKind.CANCELLED:
        raise ToolCancelled(tool, error.message)
    raise ToolExecutionError(tool, error.type, error.message, attempts=error.attempts)


def deadline_error(
    tool: str,
    error: ToolTimeoutError,
    sent: tuple[bool, bool, str] | None,
    *,
    stalled: bool,
    call_id: str | None = None,
) -> RemoteToolError:
    """What a caller whose deadline passed hears, by how far its send got.

    Args:
        tool: The tool's name.
        error: The deadline's own error.
        sent: ``(confirmed, written, why the last send failed)`` as the caller left the
            call (``CallState.abandon``), or None for a call with nothing to send.
        stalled: Whether the broker has kept the client's sends waiting, or failed them.
        call_id: The call's id, set as the returned error's ``call_id``.
    """
    chosen = _deadline_error(tool, error, sent, stalled=stalled)
    chosen.call_id = call_id
    return chosen


def _deadline_error(
    tool: str, error: ToolTimeoutError, sent: tuple[bool, bool, str] | None, *, stalled: bool
) -> RemoteToolError:
    if sent is None:
        return error
    confirmed, written, why = sent
    if confirmed or not (why or stalled):
        # Sent and queued; or Redis was answering and the deadline was shorter than the
        # way there (its send not taken yet, or on its way): the deadline passed, no more.
        return error
    if written:
        return ToolOutcomeUnknown(tool, error.timeout, reason=why)
    return BrokerUnavailable(
        f"cannot send the call to {tool!r}: the broker could not take it within its "
        f"{error.timeout:g}s deadline{f' ({why})' if why else ''}; the call was not sent",
        tool=tool,
    )
