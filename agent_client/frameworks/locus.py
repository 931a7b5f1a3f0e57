"""locus integration: a :class:`RemoteTool` as a real ``locus`` ``Tool``.

``Agent(tools=remote_tools().as_locus())`` or ``tools=[remote_tool("search").as_locus()]``
(locus takes ``Tool`` instances only). The Tool's function is ``async``, so locus
awaits it on its own loop; no thread is used per call.

(a) Run id. An enclosing ``run_scope()`` wins, so one scope can span several locus
runs. Otherwise: locus binds a ``ToolContext`` around every tool call; the function
reads ``current_tool_context().run_id`` (one ``Agent.run``/``arun``; a new turn on a
thread is a new run) and passes it to ``invoke``: repeats of an idempotent call within
one locus run share one execution, two runs do not. With no locus run (an empty run
id) and no scope, each call is its own run.

locus reuses the earlier result of a ``Tool(idempotent=True)`` for a repeat in the
same run, errors included, without calling the function. The Tool is therefore
declared ``idempotent=False`` even for idempotent remote tools: deduplication stays
in toolexec, where a retry after a timeout joins the execution still running.

(b) Deadlines. locus has no default tool timeout, so toolexec's precedence applies:
``remote_tool(timeout=)``, ``remote_tools(default_timeout=)``, the tool's own, the
settings. A locus before-tool hook may give one call its own deadline (the call
level) through locus's invocation-only secret arguments, which are never recorded::

    event.secret_arguments = {CALL_TIMEOUT: 30.0}

(c) Errors. The function raises the :class:`RemoteToolError`; locus turns a raising
tool into the result ``Error: <type>: <first line>`` and the run goes on, e.g.
``Error: ToolTimeoutError: tool 'slow_report' timed out after 0.5s`` or
``Error: ToolArgumentsInvalid: invalid arguments for tool 'book_flight': flight_id: ...``.

(d) Approval, as locus asks for it: its admission gate. A tool that requires approval
(``@tool(requires_approval=True)``, or the proxy's override) is wrapped with
``locus.control.gate_tool(..., on_refusal="interrupt", approval=store)``, which needs
the ``ApprovalStore`` where decisions are recorded: ``as_locus(approvals=store)``
(``InMemoryApprovals()``, ``FileApprovals(path)``...; without one, building such a tool
raises ``ValueError``). The call pauses the run: the agent yields an
``InterruptEvent`` whose metadata carries the ``approval_id``; a person decides
(``store.decide(approval_id, "approved", by="ada")``, or the ``locus approvals``
command), and ``agent.resume(..., perform_dangling=True)`` sends an approved call once
and never a denied one (the model reads locus's refusal).

(e) Progress. The Tool declares ``emits_progress=True``, so each report a remote tool
makes streams live as a locus ``ToolProgressEvent`` (``progress``, ``total``,
``message``) between the call's ``ToolStartEvent`` and ``ToolCompleteEvent``
(``agent.run(...)``'s events). When nothing listens, no progress is asked for.

(f) Cancellation. locus cancels a run two ways, and each abandons the call: the cancel
of the task awaiting ``agent.arun`` reaches ``invoke`` as the ``CancelledError`` it is;
``agent.cancel()`` (``cancel(thread_id=)`` too) sets the run's cancel signal, which locus
checks between iterations and links the subagents a tool spawns to. A remote tool is
linked the same way: while its call runs, the signal is looked at every
:data:`CANCEL_POLL` seconds, and once it is set the call is abandoned and the model
reads ``Error: ToolCancelled: the call to 'x' was cancelled: its locus run was
cancelled``, before the run stops (``stop_reason="cancelled"``). Abandoned, a tool
declared ``@tool(on_abandon="cancel")`` is stopped on its worker; one that leaves it
(the default) runs on. locus offers the signal to tool bodies only through the private
``locus.agent.subagent._PARENT_RUN`` (what ``run_subagent`` reads); without it a call
is not linked, and ``tests/integration/frameworks/test_cancels.py`` pins it.

This module imports locus (the ``toolexec[locus]`` extra) only when a Tool is built.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from agent_client.deadline import NOT_SET, Timeout, check_timeout
from agent_client.errors import ToolCancelled
from agent_client.frameworks import require
from agent_client.runs import current_run_id

if TYPE_CHECKING:
    from locus.control.approvals import ApprovalStore
    from locus.tools.decorator import Tool

    from agent_client.progress import ProgressCallback
    from agent_client.remote import RemoteTool

__all__ = ["APPROVAL_LABEL", "CALL_TIMEOUT", "CANCEL_POLL", "locus_tool"]

T = TypeVar("T")

#: The label of the action a gated call asks locus's policy about: the one label the
#: policy of a tool that requires approval sends to a person.
APPROVAL_LABEL = "toolexec:requires_approval"

#: The secret argument a before-tool hook sets to give one call its deadline. No tool
#: parameter can clash with it: toolexec schemas come from pydantic, which keeps
#: names with a leading underscore private.
CALL_TIMEOUT = "_toolexec_timeout"

#: Seconds between two looks at the locus run's cancel signal while a call runs.
CANCEL_POLL = 0.1


def locus_tool(remote: RemoteTool, *, approvals: ApprovalStore | None = None) -> Tool:
    """Build the ``locus`` ``Tool`` that runs ``remote`` on a worker.

    Args:
        remote: The proxy to run.
        approvals: Where locus records the decisions on the calls of a tool that
            requires approval; needed for such a tool only.

    Raises:
        MissingExtra: locus is not installed.
        ValueError: ``remote`` requires approval and no ``approvals`` store was given.
    """
    require("locus", extra="locus", framework="locus")
    from locus.tools.context import current_tool_context, progress_reporter
    from locus.tools.decorator import Tool

    if remote.requires_approval and approvals is None:
        raise ValueError(
            f"tool {remote.name!r} requires approval: pass as_locus(approvals=...) a locus "
            "ApprovalStore (locus.control.InMemoryApprovals(), FileApprovals(path), ...) where the "
            "decisions are recorded, or override requires_approval=False for this proxy"
        )

    async def call(**arguments: Any) -> Any:
        timeout: Timeout = NOT_SET
        if CALL_TIMEOUT in arguments:
            timeout = check_timeout(arguments.pop(CALL_TIMEOUT), what=CALL_TIMEOUT)
        context = current_tool_context()
        run_id = None  # None: the enclosing run_scope(), if any
        if current_run_id() is None and context is not None and context.run_id:
            run_id = context.run_id
        reporter = progress_reporter()  # read in the tool's own task; None: nobody listens
        on_progress: ProgressCallback | None = None
        if reporter is not None:
            on_progress = lambda event: reporter(event.done, event.total, event.message)
        # A RemoteToolError propagates: locus shows it to the model as the result.
        work = remote.invoke(arguments, timeout=timeout, run_id=run_id, on_progress=on_progress)
        return await _unless_run_cancelled(work, _run_cancel_signal(), remote.name)

    call.__name__ = call.__qualname__ = remote.name
    call.__doc__ = remote.description
    tool = Tool(
        name=remote.name,
        description=remote.description,
        parameters=remote.parameters,
        fn=call,
        idempotent=False,  # locus would cache results and errors; toolexec deduplicates
        emits_progress=True,
    )
    if not remote.requires_approval:
        return tool
    return _gated(tool, approvals)


def _run_cancel_signal() -> threading.Event | None:
    """The cancel signal of the locus run this tool call is in, or None outside one.

    What ``locus.agent.subagent.run_subagent`` links a subagent to: the loop sets its
    run as a context variable that the tool's task inherits (private; pinned by a test).
    """
    try:
        from locus.agent.subagent import _PARENT_RUN
    except ImportError:
        return None
    signal = getattr(_PARENT_RUN.get(), "cancel_signal", None)
    return signal if isinstance(signal, threading.Event) else None


async def _unless_run_cancelled(work: Awaitable[T], signal: threading.Event | None, tool: str) -> T:
    """Await ``work``, abandoning it once ``signal`` is set (the locus run was cancelled).

    Raises:
        ToolCancelled: The run was cancelled while the call ran.
    """
    if signal is None:
        return await work
    task = asyncio.ensure_future(work)
    try:
        while not signal.is_set():
            done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL)
            if done:
                return task.result()
    finally:
        if not task.done():  # the run was cancelled, or this task was
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise ToolCancelled(
            tool, f"the call to {tool!r} was cancelled: its locus run was cancelled"
        )
    return task.result()  # it ended as the signal came


def _gated(tool: Tool, approvals: ApprovalStore | None) -> Tool:
    """``tool`` behind locus's admission gate, every call held for a person's decision."""
    from locus.control import Action, ControlPolicy, default_action, gate_tool

    def action(name: str, arguments: Mapping[str, Any]) -> Action:
        return default_action(name, arguments, tags=frozenset({name, APPROVAL_LABEL}))

    gated = gate_tool(
        tool,
        policy=ControlPolicy(
            require_verification_score=0.0, require_human_for=frozenset({APPROVAL_LABEL})
        ),
        action=action,
        on_refusal="interrupt",
        approval=approvals,
        refusal_reason="the tool requires a person's approval",
    )
    gated.emits_progress = True  # the gate's copy leaves it out
    return gated
