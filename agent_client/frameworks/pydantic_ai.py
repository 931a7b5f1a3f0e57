"""pydantic-ai integration: a :class:`RemoteTool` as a real ``pydantic_ai.Tool``.

``Agent(model, tools=remote_tools().as_pydantic_ai())`` works because each proxy is
built with ``Tool.from_schema`` from the catalog's JSON Schema. Its function is
``async`` and takes the ``RunContext``, so pydantic-ai awaits it on its own loop and
can cancel it; no thread is used per call.

(a) Run id, the first that applies: 1. ``deps`` that carry one, as a
``toolexec_run_id`` (else ``run_id``) attribute or mapping key
(``agent.run(..., deps=Deps(toolexec_run_id="order-42"))``, or ``deps={"run_id": ...}``):
your own id, e.g. to keep one run across a resumed conversation; 2. an enclosing
``run_scope()``; 3. ``RunContext.run_id``: ``agent.run(..., run_id=...)`` or the fresh
UUID7 pydantic-ai gives each run (inside a durable workflow, one derived from the
workflow's run, so a re-executed run keeps its id). pydantic-ai cannot tell a given
``run_id=`` from its own, so inside a ``run_scope()`` the scope wins over both. One
``agent.run`` is one toolexec run: repeats within it share one execution, separate
runs do not.

(b) Deadline: toolexec enforces it, pydantic-ai does not race it (the Tool's own
timeout is :data:`NO_LIMIT`). The framework level is the ``timeout`` of the
``FunctionToolset`` holding the Tool: ``Agent(tool_timeout=)`` or
``FunctionToolset(tools, timeout=)``. Precedence: ``remote_tool(timeout=)`` > that
toolset timeout > ``remote_tools(default_timeout=)`` > ``@tool(timeout=)`` > settings.

(c) Errors, as pydantic-ai means them: invalid arguments (refused before sending; the
text names each field) are a ``ModelRetry``, which asks the model to fix its call and
costs one of the tool's :data:`MAX_RETRIES` (pydantic-ai resets the count when the tool
succeeds; past them it ends the run with ``UnexpectedModelBehavior``). What retrying
the same arguments cannot fix is a ``ToolFailed``, shown to the model as a failed tool
result that costs no retry: a timeout (``tool 'x' timed out after 0.5s; ...``), a
remote exception (``tool 'x' failed: <RemoteType>: <message>``), a lost worker, an
outcome unknown, a tool no worker serves, and a call someone else cancelled
(``toolexec cancel``, ``CallHandle.cancel()``: ``the call to 'x' was cancelled: it was
stopped on purpose, so do not call it again unless you are asked to``). So a run with
any number of timeouts in a row still ends with the model's answer; bound repeated
failures with pydantic-ai's ``UsageLimits``. ``BrokerUnavailable`` is not the model's
to fix: it propagates and ends the run.

(d) Approval: a tool that requires approval (``@tool(requires_approval=True)``, or the
proxy's override) is a pydantic-ai ``Tool(requires_approval=True)``: the run ends with
``DeferredToolRequests`` (give the agent ``output_type=[str, DeferredToolRequests]``),
and the next run, given ``deferred_tool_results=DeferredToolResults(approvals=...)``,
sends each approved call once; a denied one (``False`` or ``ToolDenied``) is never
sent, and the model is told so.

(e) Progress: each report a remote tool makes reaches the run's event stream
(``event_stream_handler``, ``run_stream_events``, ``iter``, the UI adapters) as a
:class:`RemoteToolProgress` custom event, stamped with the call's ``tool_call_id`` and
``tool_name``.

(f) Cancellation. pydantic-ai cancels a tool's task when its run is cancelled:
``AgentRun.cancel()``, ``RunContext.cancel()`` or a ``CancellationToken`` (the run
ends with ``RunCancelled``), the run's ``timeout=`` (``RunTimedOut``), or a cancel of
the task awaiting ``agent.run`` (``CancelledError``). The ``CancelledError`` reaches
``invoke`` untouched, so the caller abandons the call: a tool declared
``@tool(on_abandon="cancel")`` is stopped on its worker, one that leaves it (the
default) runs on and its result is dropped.

This module imports pydantic-ai (the ``toolexec[pydantic-ai]`` extra); nothing imports
it until ``as_pydantic_ai()`` is called.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_client.deadline import NOT_SET, Timeout
from agent_client.errors import (
    BrokerUnavailable,
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolCancelled,
    ToolTimeoutError,
)
from agent_client.frameworks import cancelled_text, carried_run_id, require
from agent_client.progress import ProgressEvent
from agent_client.runs import current_run_id

require("pydantic_ai", extra="pydantic-ai", framework="pydantic-ai")

from pydantic_ai import CustomEvent, ModelRetry, RunContext, Tool, ToolFailed, UserError
from pydantic_ai.toolsets import FunctionToolset, WrapperToolset

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = [
    "MAX_RETRIES",
    "NO_LIMIT",
    "RemoteToolProgress",
    "failure_message",
    "pydantic_ai_tool",
    "run_id_for",
]

#: ``ModelRetry`` results (invalid arguments) pydantic-ai allows each remote tool (its own
#: default is 1); failures (``ToolFailed``) cost none.
MAX_RETRIES = 3

#: The Tool's own pydantic-ai timeout, a year: toolexec's deadline is the one that fires.
NO_LIMIT = 365 * 24 * 3600.0


@dataclass(kw_only=True)
class RemoteToolProgress(CustomEvent, name="toolexec.tool_progress"):
    """A remote tool's progress report, as a pydantic-ai custom event of the run.

    Its fields are those of :class:`~agent_client.progress.ProgressEvent`; pydantic-ai
    stamps ``tool_call_id`` and ``tool_name`` with the call's.
    """

    done: float
    total: float | None = None
    message: str | None = None


def pydantic_ai_tool(remote: RemoteTool, *, max_retries: int = MAX_RETRIES) -> Tool[Any]:
    """Build the ``pydantic_ai.Tool`` that runs ``remote`` on a worker.

    Args:
        remote: The proxy to run.
        max_retries: How many ``ModelRetry`` results (invalid arguments) pydantic-ai
            allows the tool.
    """
    tool: Tool[Any]

    async def call(ctx: RunContext[Any], **arguments: Any) -> Any:
        framework = _toolset_timeout(ctx, tool)
        try:
            return await remote.invoke(
                arguments,
                run_id=run_id_for(ctx),
                framework_timeout=framework,
                on_progress=_emitter(ctx),
            )
        except BrokerUnavailable:
            raise
        except ToolArgumentsInvalid as exc:
            raise ModelRetry(str(exc)) from exc
        except RemoteToolError as exc:
            raise ToolFailed(failure_message(remote, exc)) from exc

    tool = Tool.from_schema(
        call, remote.name, remote.description, remote.parameters, takes_ctx=True
    )
    tool.max_retries = max_retries
    tool.timeout = NO_LIMIT
    tool.requires_approval = remote.requires_approval
    return tool


def failure_message(remote: RemoteTool, error: RemoteToolError) -> str:
    """The text the model is shown for ``error``: its message, with a hint for timeouts
    and cancels."""
    if isinstance(error, ToolCancelled):
        return cancelled_text(error)
    if not isinstance(error, ToolTimeoutError):
        return str(error)
    if remote.idempotent:
        return f"{error}; calling it again with the same arguments waits for the same execution."
    return f"{error}; the call was abandoned. Call it again or carry on without it."


def _emitter(ctx: RunContext[Any]) -> Callable[[ProgressEvent], Awaitable[None]]:
    """The ``on_progress`` that emits each report into the run's event stream."""
    silent = False

    async def emit(event: ProgressEvent) -> None:
        nonlocal silent
        if silent:
            return
        try:
            await ctx.emit(
                RemoteToolProgress(done=event.done, total=event.total, message=event.message)
            )
        except UserError:  # this RunContext has no event stream (nothing to tell)
            silent = True

    return emit


def run_id_for(ctx: RunContext[Any]) -> str | None:
    """The toolexec run of a tool call; None defers to the enclosing ``run_scope()``."""
    carried = carried_run_id(ctx.deps)
    if carried is not None:
        return carried
    if current_run_id() is not None:
        return None
    return ctx.run_id or None


def _toolset_timeout(ctx: RunContext[Any], tool: Tool[Any]) -> Timeout:
    """The timeout of the FunctionToolset holding ``tool`` in this run, or NOT_SET.

    pydantic-ai keeps it on the toolset (the agent's own one for ``Agent(tool_timeout=)``),
    not on the context; the run step's tool manager leads to it through any wrappers
    (prefixed, renamed, ...).
    """
    manager = ctx.tool_manager
    held = manager.tools if manager is not None and manager.tools is not None else {}
    for candidate in held.values():
        toolset = candidate.toolset
        while isinstance(toolset, WrapperToolset):
            toolset = toolset.wrapped
        if isinstance(toolset, FunctionToolset) and any(t is tool for t in toolset.tools.values()):
            return NOT_SET if toolset.timeout is None else toolset.timeout
    return NOT_SET
