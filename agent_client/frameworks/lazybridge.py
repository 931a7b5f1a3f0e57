"""LazyBridge integration: a :class:`RemoteTool` as a real ``lazybridge.Tool``.

``Agent(tools=[remote_tool("search")])`` works because ``RemoteTool`` is a LazyBridge
ToolProvider whose ``as_tools()`` lands here. The Tool's function is ``async``, so
LazyBridge awaits it on its loop and can cancel it; no thread is used per call.

(a) Runs. LazyBridge shows a tool no run id (``LLMEngine`` makes one per engine
pass, for session events only), so importing this module, which the first
``as_tools()`` does, wraps ``lazybridge.Agent.run`` and ``Agent.stream`` once per
process: each opens a :func:`~agent_client.run_scope` unless one is already open.
This touches every Agent in the process, but a run scope changes nothing except
toolexec calls. ``agent(...)`` goes through ``run``; a sub-agent, a fallback,
``verify=`` and output-validation retries run inside their caller's run. Composites
are wrapped too (:data:`SCOPED_RUNS`): ``Agent.parallel(...)``'s ``ParallelAgent``
runs its branches in one run, ``Agent.chain(...)`` is an Agent, and a ``Plan`` run
without an Agent around it (each input of ``Plan.run_many``) is one run. So the calls
of one ``agent(...)``, ``await agent.run(...)`` or ``agent.stream(...)`` share one
toolexec run, separate or concurrent calls (tasks, threads) do not, and an enclosing
``run_scope()`` wins. A stream holds its scope only while it is resumed: the engine
starts its loop task (which copies the context) in the first resume, and the
consumer's code between chunks runs outside the run.

(b) Deadlines follow toolexec's precedence with ``Agent(tool_timeout=)``, else
``LLMEngine(tool_timeout=)``, as the framework level: LazyBridge hands the effective
limit (the Tool's own, else the agent's, else the engine's) to the private
``Tool._dispatch``, which this module's subclass records for the call. A proxy's own
``remote_tool(timeout=)`` becomes the Tool's ``timeout``, so it wins as LazyBridge's
own ``Tool(timeout=)`` does; ``remote_tools(default_timeout=)`` does not (it ranks
below the framework level), and with no framework level set LazyBridge passes no
limit, so the toolset's default, the tool's own, then settings apply.

(c) A remote timeout raises LazyBridge's own ``ToolTimeoutError``, so the model is
shown ``[TOOL_TIMEOUT] Tool 'name' timed out after 0.5s``; any other remote failure,
a ``TimeoutError`` the tool raised itself included, is shown as ``Tool error: ...``
with the remote type in the text. Either way the run goes on.

(d) Progress. When an ``Agent`` has a ``Session`` (``Agent(session=Session(...))``,
inherited by its sub-agents), each report a remote tool makes
(``executor.report_progress`` on the worker) is emitted into it with ``Session.emit``
as one :data:`TOOL_PROGRESS` event, between the call's ``tool_call`` and its
``tool_result``, under the same LazyBridge run id and with the same ``agent_name``,
``tool`` and ``tool_use_id``, so exporters (``ConsoleExporter``, ``JsonFileExporter``,
``CallbackExporter``...) and ``session.events.query(event_type=TOOL_PROGRESS)`` show it
beside the call. Its payload adds ``done``, ``total`` and ``message``; the session's
redaction applies as to any event. Without a session nothing is emitted and no
progress is asked for. LazyBridge has no event type for progress, so
:data:`TOOL_PROGRESS` is a name of ours (``"tool_progress"``, beside its
``"tool_call"``); its ``"hybrid"`` back-pressure treats it as a droppable event, like
``loop_step``. Only the engine knows the run id and the call's id: LazyBridge hands them
to ``LLMEngine._exec_tool``, a private method, which this module wraps once per process
to remember them for the call (pinned by
``tests/integration/frameworks/test_lazybridge_progress.py``). A tool run by another
engine (a ``Plan`` step calling a tool directly) reports no progress.

(e) Approval, as LazyBridge asks for it: the engine's ``ApprovalGate``
(``LLMEngine(..., approval_gate=gate)``), which LazyBridge asks before every tool call
of the engine, so an approved call is sent once and a denied one never is (the model
reads ``Tool error: <the gate's message>``). A tool that requires approval
(``@tool(requires_approval=True)``, or the proxy's override) run by an engine with no
gate is refused the same way, as LazyBridge refuses what no gate allowed: nothing is
sent, and the model reads ``Tool error: tool 'x' requires approval ...``. To ask a
person about some tools only, give the gate rules, e.g. LazyBridge's ``TieredGate``
(``Rule("ask", "book_flight"), Rule("allow", "*")``). The engine is learnt from the
same wrapped ``LLMEngine._exec_tool`` as (d).

(f) Cancellation. LazyBridge cancels a tool's coroutine when the task awaiting
``agent.run`` is cancelled, when ``Agent(timeout=)`` passes (the run returns an error
envelope), when its tool bound passes first (``Agent(tool_timeout=)``), and when a
``stream`` consumer stops reading. The ``CancelledError`` reaches ``invoke`` untouched,
so the caller abandons the call: a tool declared ``@tool(on_abandon="cancel")`` is
stopped on its worker (the real stop LazyBridge's docs send you to a subprocess for),
one that leaves it (the default) runs on.

The private behaviour relied on (``Tool._dispatch``'s limit; ``Agent.__call__``,
``ParallelAgent.run`` and ``__call__`` reaching the wrapped methods; tools running in
the context of the agent's run) is pinned by
``tests/integration/frameworks/test_lazybridge.py``. This module imports
LazyBridge (the ``toolexec[lazybridge]`` extra); nothing imports it until
``as_tools()`` is called.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncGenerator, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from agent_client.frameworks import require

lazybridge = require("lazybridge", extra="lazybridge", framework="LazyBridge")

from lazybridge import Agent, LLMEngine, ParallelAgent, Plan, Session, Tool
from lazybridge.session import EventType

from agent_client.deadline import NOT_SET, Timeout
from agent_client.errors import ToolTimeoutError
from agent_client.progress import ProgressCallback, ProgressEvent
from agent_client.runs import current_run_id, run_scope

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = [
    # Tools
    "lazybridge_tool",
    "lazybridge_limit",
    "NO_LIMIT",
    # Runs
    "SCOPED_RUNS",
    "scope_agent_runs",
    # Progress
    "TOOL_PROGRESS",
    "record_tool_calls",
    "session_progress",
]

#: The limit LazyBridge is enforcing on the current tool call (its ``_dispatch`` arg).
_framework_limit: ContextVar[Timeout] = ContextVar("toolexec_lazybridge_limit", default=NOT_SET)

#: Set on the wrappers, so wrapping twice (a reload) is a no-op.
_SCOPED = "__toolexec_run_scope__"


class _RemoteTool(Tool):
    # LazyBridge 1.8 passes the effective limit (the tool's own, else Agent's
    # tool_timeout, else LLMEngine's) only to this private method; a test pins it.
    async def _dispatch(self, kwargs: dict[str, Any], timeout: float | None) -> Any:
        token = _framework_limit.set(NOT_SET if timeout is None else timeout)
        try:
            return await super()._dispatch(kwargs, timeout)
        finally:
            _framework_limit.reset(token)


def lazybridge_tool(remote: RemoteTool) -> Tool:
    """Build the ``lazybridge.Tool`` that runs ``remote`` on a worker."""

    async def call(**arguments: Any) -> str:
        if remote.requires_approval:
            _refuse_unless_gated(remote.name)
        try:
            result = await remote.invoke(
                arguments,
                framework_timeout=_framework_limit.get(),
                on_progress=session_progress(remote.name),
            )
        except ToolTimeoutError as exc:
            # Worded as LazyBridge words its own, so the model reads the same text
            # whichever deadline fires first.
            message = f"Tool {remote.name!r} timed out after {exc.timeout}s"
            raise lazybridge.ToolTimeoutError(
                message, tool_name=remote.name, timeout=exc.timeout
            ) from exc
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)

    tool: Tool = _RemoteTool.from_schema(
        remote.name,
        remote.description,
        remote.parameters,
        call,
        timeout=lazybridge_limit(remote),
    )
    return tool


def _refuse_unless_gated(tool: str) -> None:
    """Refuse a call of ``tool``, which requires approval, that no approval gate was asked about.

    Raises:
        PermissionError: What LazyBridge raises for a call its gate did not allow.
    """
    call = _current.get()
    if call is None or not call.gated:
        raise PermissionError(
            f"tool {tool!r} requires approval, and no approval gate was asked: give the agent's "
            "engine one, LLMEngine(..., approval_gate=...); nothing was sent"
        )


#: What "no deadline" is told to LazyBridge: a year.
NO_LIMIT = 365 * 24 * 3600.0


def lazybridge_limit(remote: RemoteTool) -> float | None:
    """The limit LazyBridge should enforce itself: the proxy's own, if it has one.

    Left None otherwise, so ``Agent(tool_timeout=)`` (else ``LLMEngine(tool_timeout=)``)
    applies as the framework level, above ``remote_tools(default_timeout=)``.
    LazyBridge has no per-tool "no limit", so a proxy set to None (no deadline) gets
    :data:`NO_LIMIT`, which outranks the agent's default.
    """
    level = remote.proxy_timeout
    if level is NOT_SET:
        return None
    return NO_LIMIT if level is None else float(level)


# -- one toolexec run per agent run ---------------------------------------------------

_Run = Callable[..., Coroutine[Any, Any, Any]]
_Stream = Callable[..., AsyncGenerator[str, None]]


def _scoped_run(run: _Run) -> _Run:
    @functools.wraps(run)
    async def scoped(self: object, *args: Any, **kwargs: Any) -> Any:
        if current_run_id() is not None:
            return await run(self, *args, **kwargs)
        with run_scope():
            return await run(self, *args, **kwargs)

    setattr(scoped, _SCOPED, True)
    return scoped


def _scoped_stream(stream: _Stream) -> _Stream:
    @functools.wraps(stream)
    async def scoped(self: Agent, *args: Any, **kwargs: Any) -> AsyncGenerator[str, None]:
        # Set and reset within each resume: the engine starts its loop task (which
        # copies the context) in the first one, and the consumer's code between
        # chunks, or a finaliser in another context, never sees the scope.
        outer = current_run_id() is not None
        scope: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if outer else run_scope()
        )
        chunks = stream(self, *args, **kwargs)
        try:
            while True:
                with scope:
                    try:
                        chunk = await anext(chunks)
                    except StopAsyncIteration:
                        return
                yield chunk
        finally:
            await chunks.aclose()

    setattr(scoped, _SCOPED, True)
    return scoped


#: The run entry points wrapped, as (class, method): each opens the run of what it runs.
SCOPED_RUNS: tuple[tuple[type, str], ...] = (
    (Agent, "run"),  # agent(...) and await agent.run(...); Agent.chain's too
    (ParallelAgent, "run_branches"),  # Agent.parallel(...): its run, __call__ and as_tool
    (Plan, "run"),  # a Plan run without an Agent around it, e.g. each of Plan.run_many's
)


def scope_agent_runs() -> None:
    """Make each LazyBridge run a toolexec run (idempotent; done on import).

    Wraps :data:`SCOPED_RUNS` and ``Agent.stream``: each opens a fresh
    :func:`~agent_client.run_scope` unless one is already open, so what runs inside
    (a chain's steps, a fan-out's branches, sub-agents) shares the outermost run.
    """
    for owner, name in SCOPED_RUNS:
        method = getattr(owner, name)
        if not getattr(method, _SCOPED, False):
            setattr(owner, name, _scoped_run(method))
    if not getattr(Agent.stream, _SCOPED, False):
        Agent.stream = _scoped_stream(Agent.stream)  # type: ignore[method-assign]


# -- progress as session events ---------------------------------------------------------

#: The ``event_type`` of a remote tool's progress in a LazyBridge Session.
TOOL_PROGRESS = "tool_progress"

#: Set on the engine's wrapper, so wrapping twice (a reload) is a no-op.
_RECORDING = "__toolexec_records_tool_calls__"


@dataclass(frozen=True, slots=True)
class _ToolCall:
    """What LazyBridge's own events of one tool call carry, and whether a gate approved it."""

    session: Session | None
    run_id: str
    agent_name: str
    tool_use_id: str
    gated: bool


#: The LazyBridge tool call running in this context (an ``LLMEngine``'s).
_current: ContextVar[_ToolCall | None] = ContextVar("toolexec_lazybridge_tool_call", default=None)


def session_progress(tool: str) -> ProgressCallback | None:
    """The ``on_progress`` that emits ``tool``'s reports into this call's session, or None.

    None outside a LazyBridge tool call, or when its agent has no session.
    """
    call = _current.get()
    if call is None or call.session is None:
        return None
    session = call.session

    def emit(event: ProgressEvent) -> None:
        payload = {
            "agent_name": call.agent_name,
            "tool": tool,
            "tool_use_id": call.tool_use_id,
            "done": event.done,
            "total": event.total,
            "message": event.message,
        }
        session.emit(cast(EventType, TOOL_PROGRESS), payload, run_id=call.run_id)

    return emit


_ExecTool = Callable[..., Coroutine[Any, Any, Any]]


def _recording(exec_tool: _ExecTool) -> _ExecTool:
    @functools.wraps(exec_tool)
    async def recording(
        self: LLMEngine,
        tc: Any,
        tool_map: Any,
        *,
        agent_name: str,
        session: Session | None,
        run_id: str,
        **options: Any,
    ) -> Any:
        # The tool runs in this context (or a task copied from it), so it sees the call;
        # LazyBridge asks the engine's gate, if it has one, before it runs any tool.
        gated = getattr(self, "approval_gate", None) is not None
        call = _ToolCall(session, run_id, agent_name, str(tc.id), gated)
        token = _current.set(call)
        try:
            return await exec_tool(
                self, tc, tool_map, agent_name=agent_name, session=session, run_id=run_id, **options
            )
        finally:
            _current.reset(token)

    setattr(recording, _RECORDING, True)
    return recording


def record_tool_calls() -> None:
    """Remember each ``LLMEngine`` tool call's session, run, id and gate (idempotent;
    done on import)."""
    if not getattr(LLMEngine._exec_tool, _RECORDING, False):
        LLMEngine._exec_tool = _recording(LLMEngine._exec_tool)  # type: ignore[method-assign]


scope_agent_runs()
record_tool_calls()
