"""A remote tool's progress as LazyBridge session events.

When an ``Agent`` has a ``Session`` (``Agent(session=Session(...))``, inherited by its
sub-agents), each report a remote tool makes (``executor.report_progress`` on the
worker) is emitted into it with ``Session.emit`` as one :data:`TOOL_PROGRESS` event,
between the call's ``tool_call`` and its ``tool_result``, under the same LazyBridge
run id and with the same ``agent_name``, ``tool`` and ``tool_use_id``, so exporters
(``ConsoleExporter``, ``JsonFileExporter``, ``CallbackExporter``...) and
``session.events.query(event_type=TOOL_PROGRESS)`` show it beside the call. Its
payload adds ``done``, ``total`` and ``message``; the session's redaction applies as to
any event. Without a session nothing is emitted and no progress is asked for.

LazyBridge has no event type for progress, so :data:`TOOL_PROGRESS` is a name of ours
(``"tool_progress"``, beside its ``"tool_call"``); its ``"hybrid"`` back-pressure
treats it as a droppable event, like ``loop_step``. Only the engine knows the run id
and the call's id: LazyBridge hands them to ``LLMEngine._exec_tool``, a private method,
which this module wraps once per process to remember them for the call (pinned by
``tests/integration/frameworks/test_lazybridge_progress.py``). A tool run by another
engine (a ``Plan`` step calling a tool directly) reports no progress.

This module imports LazyBridge (the ``toolexec[lazybridge]`` extra).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from agent_client.frameworks import require

require("lazybridge", extra="lazybridge", framework="LazyBridge")

from lazybridge import LLMEngine, Session
from lazybridge.session import EventType

from agent_client.progress import ProgressCallback, ProgressEvent

__all__ = ["TOOL_PROGRESS", "record_tool_calls", "session_progress"]

#: The ``event_type`` of a remote tool's progress in a LazyBridge Session.
TOOL_PROGRESS = "tool_progress"

#: Set on the wrapper, so wrapping twice (a reload) is a no-op.
_RECORDING = "__toolexec_records_tool_calls__"


@dataclass(frozen=True, slots=True)
class _ToolCall:
    """What LazyBridge's own events of one tool call carry."""

    session: Session
    run_id: str
    agent_name: str
    tool_use_id: str


#: The LazyBridge tool call running in this context, when its agent has a session.
_current: ContextVar[_ToolCall | None] = ContextVar("toolexec_lazybridge_tool_call", default=None)


def session_progress(tool: str) -> ProgressCallback | None:
    """The ``on_progress`` that emits ``tool``'s reports into this call's session, or None.

    None outside a LazyBridge tool call, or when its agent has no session.
    """
    call = _current.get()
    if call is None:
        return None

    def emit(event: ProgressEvent) -> None:
        payload = {
            "agent_name": call.agent_name,
            "tool": tool,
            "tool_use_id": call.tool_use_id,
            "done": event.done,
            "total": event.total,
            "message": event.message,
        }
        call.session.emit(cast(EventType, TOOL_PROGRESS), payload, run_id=call.run_id)

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
        # The tool runs in this context (or a task copied from it), so it sees the call.
        call = None if session is None else _ToolCall(session, run_id, agent_name, str(tc.id))
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
    """Remember each ``LLMEngine`` tool call's session, run and id (idempotent; done on import)."""
    if not getattr(LLMEngine._exec_tool, _RECORDING, False):
        LLMEngine._exec_tool = _recording(LLMEngine._exec_tool)  # type: ignore[method-assign]


record_tool_calls()
