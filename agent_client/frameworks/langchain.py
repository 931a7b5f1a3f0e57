"""LangChain integration: a :class:`RemoteTool` as a ``langchain_core`` ``StructuredTool``.

``create_agent(model, remote_tools().as_langchain())`` (``langchain.agents``; LangGraph's
``ToolNode`` in a graph of your own, the same) works as written: the
tool's ``args_schema`` is the tool's JSON Schema (LangChain validates nothing against
a dict schema, so the proxy does, before anything is sent). The tool has both a
``coroutine`` (``await remote.invoke``: no thread per call on async paths) and a sync
``func`` (``remote.invoke_sync``). It returns ``(content, artifact)``: the model reads
the result as JSON text, the ``ToolMessage.artifact`` keeps the Python value.

(a) Run id, from the ``RunnableConfig`` the tool is called with, first found of:
``configurable["toolexec_run_id"]``; LangGraph's run id (``config["run_id"]`` given to
the graph, or ``metadata["run_id"]``, which LangGraph reads as the run's id); an
enclosing ``run_scope()``; the LangGraph invocation (one ``invoke``/``stream`` of a
graph, its subgraphs included); the parent run (e.g. a LangChain agent executor's).
A tool called with none of these is its own run.

(b) Deadline: LangChain and LangGraph have no per-tool default timeout (LangGraph's
``step_timeout`` bounds a whole step), so none is passed as the framework level;
precedence is the proxy's timeout (``remote_tool(timeout=)``),
``remote_tools(default_timeout=)``, the tool's own, then settings.

(c) Errors: a refused call, a tool failure, a timeout, a lost worker or a tool no
worker serves raises ``ToolException`` with the error's text, and the tool sets
``handle_tool_error=True``, so the model gets a ``ToolMessage`` with
``status="error"`` and the run goes on; a call someone else cancelled (``toolexec
cancel``, ``CallHandle.cancel()``) reads ``the call to 'x' was cancelled: it was
stopped on purpose, so do not call it again unless you are asked to``.
:class:`BrokerUnavailable` propagates: no retry by the model can fix it.

(d) Approval, as LangChain asks for it: LangGraph's interrupt. A tool that requires
approval (``@tool(requires_approval=True)``, or the proxy's override) calls
``langgraph.types.interrupt`` before anything is sent, with the value LangChain's
``HumanInTheLoopMiddleware`` raises per call (``{"type": "tool_approval",
"tool_call_id", "name", "args", "description"}``), so the graph (``create_agent(...,
checkpointer=...)``, or a ``ToolNode`` of yours) pauses. Resume it with one of
LangChain's decisions, ``Command(resume={"type": "approve"})`` or ``{"type": "reject",
"message": "..."}`` (several pending: ``Command(resume={interrupt.id: decision})``): an
approved call is sent once; a rejected one never is, and the model reads LangChain's
rejection text as a ``ToolMessage`` with ``status="error"``. Any other answer raises
``ValueError`` naming the two; a call outside a LangGraph graph raises
:class:`ApprovalUnavailable` and sends nothing. Do not also list such a tool in a
``HumanInTheLoopMiddleware``: it would be asked for twice.

(e) Progress. In a LangGraph graph each report a remote tool makes is written to the
graph's custom stream (``stream_mode="custom"``; ``get_stream_writer()``'s writer) as
``{"type": "tool_progress", "tool", "tool_call_id", "done", "total", "message"}``, and
refreshes the node's idle timeout (``runtime.heartbeat()``), so a
``TimeoutPolicy(idle_timeout=...)`` counts a tool that reports as busy, while its
``run_timeout`` and the call's own deadline stay hard limits. Outside a graph no
progress is asked for.

(f) Cancellation. On the async path (``ainvoke``, ``astream``) LangGraph cancels the
tool's task when the graph's task is cancelled, or when a node's
``TimeoutPolicy(run_timeout=, idle_timeout=)`` passes (``NodeTimeoutError``); the
``CancelledError`` reaches ``invoke`` untouched, so the caller abandons the call: a tool
declared ``@tool(on_abandon="cancel")`` is stopped on its worker, one that leaves it (the
default) runs on. The sync path (``invoke``, ``stream``) cannot be cancelled: LangGraph
runs sync tools in threads and refuses a ``TimeoutPolicy`` on a sync node ("sync Python
execution cannot be safely cancelled in-process"), so a sync call waits for its outcome
or its own deadline (``remote_tool(timeout=)``), which abandons it as above.

This module imports ``langchain_core`` (the ``toolexec[langchain]`` extra); LangGraph
only where a graph already imported it, or to interrupt for an approval. Nothing
imports this module until ``as_langchain()`` is called.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from typing import TYPE_CHECKING, Any

from agent_client.errors import BrokerUnavailable, RemoteToolError, ToolCancelled
from agent_client.frameworks import cancelled_text, require
from agent_client.progress import ProgressCallback, ProgressEvent
from agent_client.runs import current_run_id

require("langchain_core", extra="langchain", framework="LangChain")

# After the check above, so a missing extra says which one to install.
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = [
    "ApprovalUnavailable",
    "RUN_ID_KEY",
    "TOOL_PROGRESS",
    "langchain_run_id",
    "langchain_tool",
]

#: The ``configurable`` key that names the toolexec run explicitly.
RUN_ID_KEY = "toolexec_run_id"

#: The ``type`` of a progress report in a LangGraph graph's custom stream.
TOOL_PROGRESS = "tool_progress"

#: The id of the model's tool call being run in this context, when the tool got one.
_tool_call_id: ContextVar[str | None] = ContextVar("toolexec_langchain_tool_call_id", default=None)


class ApprovalUnavailable(RuntimeError):
    """A tool that requires approval was called where LangGraph cannot interrupt for it."""


class _RemoteStructuredTool(StructuredTool):
    """A ``StructuredTool`` that remembers the id of the model's tool call it runs.

    LangChain hands the id to the tool's message, not to its function; the approval
    request and the progress reports carry it, as LangChain's own do.
    """

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        token = _tool_call_id.set(_call_id(input))
        try:
            return super().invoke(input, config, **kwargs)
        finally:
            _tool_call_id.reset(token)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        token = _tool_call_id.set(_call_id(input))
        try:
            return await super().ainvoke(input, config, **kwargs)
        finally:
            _tool_call_id.reset(token)


def _call_id(given: Any) -> str | None:
    if isinstance(given, dict) and given.get("type") == "tool_call" and given.get("id"):
        return str(given["id"])
    return None


def langchain_tool(remote: RemoteTool) -> StructuredTool:
    """Build the ``StructuredTool`` that runs ``remote`` on a worker."""

    # LangChain passes the tool's RunnableConfig to the parameter annotated with it;
    # the name keeps clear of any argument a tool may have.
    async def call(_toolexec_config: RunnableConfig, **arguments: Any) -> tuple[str, Any]:
        with _shown_to_the_model():
            _approve(remote, arguments)
            result = await remote.invoke(
                arguments,
                run_id=langchain_run_id(_toolexec_config),
                on_progress=_graph_progress(remote),
            )
        return _content(result), result

    def call_sync(_toolexec_config: RunnableConfig, **arguments: Any) -> tuple[str, Any]:
        with _shown_to_the_model():
            _approve(remote, arguments)
            result = remote.invoke_sync(
                arguments,
                run_id=langchain_run_id(_toolexec_config),
                on_progress=_graph_progress(remote),
            )
        return _content(result), result

    return _RemoteStructuredTool(
        name=remote.name,
        description=remote.description,
        args_schema=remote.parameters,
        func=call_sync,
        coroutine=call,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


def langchain_run_id(config: RunnableConfig) -> str | None:
    """The toolexec run of a tool call made with ``config``; None: a run of its own."""
    configurable = config.get("configurable") or {}
    runtime = _langgraph_runtime()
    execution = getattr(runtime, "execution_info", None)
    given = (
        configurable.get(RUN_ID_KEY),
        getattr(execution, "run_id", None),
        (config.get("metadata") or {}).get("run_id"),
        current_run_id(),
    )
    for run_id in given:
        if run_id:
            return str(run_id)
    control = getattr(runtime, "control", None)
    if control is not None:
        return _invocations.run_id(control)
    parent = getattr(config.get("callbacks"), "parent_run_id", None)
    return None if parent is None else str(parent)


def _approve(remote: RemoteTool, arguments: dict[str, Any]) -> None:
    """Interrupt the graph for a person's decision on this call, if the tool requires one.

    Raises:
        ToolException: The call was rejected (the model is shown LangChain's text).
        ValueError: The graph was resumed with something other than a decision.
        ApprovalUnavailable: There is no LangGraph graph to interrupt.
    """
    if not remote.requires_approval:
        return
    call_id = _tool_call_id.get()
    try:
        interrupt = importlib.import_module("langgraph.types").interrupt
    except ImportError as exc:
        raise ApprovalUnavailable(_unavailable(remote.name, "LangGraph is not installed")) from exc
    request = {
        "type": "tool_approval",
        "tool_call_id": call_id or "",
        "name": remote.name,
        "args": arguments,
        "description": (
            f"Tool execution requires approval\n\nTool: {remote.name}\nArgs: "
            f"{json.dumps(arguments)}"
        ),
    }
    try:
        decision = interrupt(request)
    except (RuntimeError, KeyError) as exc:  # outside a runnable context, or outside a graph
        raise ApprovalUnavailable(
            _unavailable(remote.name, f"{type(exc).__name__}: {exc}")
        ) from exc
    kind = decision.get("type") if isinstance(decision, dict) else None
    if kind == "approve":
        return
    if kind != "reject":
        raise ValueError(
            f"tool {remote.name!r} awaits a decision: resume with {{'type': 'approve'}} or "
            f"{{'type': 'reject', 'message': '...'}}; got {decision!r}"
        )
    if reason := decision.get("message"):
        raise ToolException(
            f"User rejected the tool call for `{remote.name}` with reason: {reason}"
        )
    raise ToolException(
        f"User rejected the tool call for `{remote.name}` with id {call_id}. The tool was not "
        "executed. Do not retry this tool call unless the user explicitly requests it."
    )


def _unavailable(tool: str, why: str) -> str:
    return (
        f"tool {tool!r} requires approval, which LangChain asks for with LangGraph's interrupt: "
        f"run it in a LangGraph graph (create_agent, or a ToolNode of yours) with a checkpointer "
        f"({why}); nothing was sent"
    )


def _graph_progress(remote: RemoteTool) -> ProgressCallback | None:
    """The ``on_progress`` that writes to the graph's custom stream and beats, or None
    outside one."""
    runtime = _langgraph_runtime()
    if runtime is None:
        return None
    writer, heartbeat, call_id = runtime.stream_writer, runtime.heartbeat, _tool_call_id.get()
    # The writer reads the graph's config from the context it is called in: the tool's.
    context = copy_context()

    def report(event: ProgressEvent) -> None:
        context.run(
            writer,
            {
                "type": TOOL_PROGRESS,
                "tool": remote.name,
                "tool_call_id": call_id,
                "done": event.done,
                "total": event.total,
                "message": event.message,
            },
        )
        heartbeat()

    return report


def _langgraph_runtime() -> Any:
    """LangGraph's runtime of the graph running this tool, or None."""
    module = sys.modules.get("langgraph.runtime")  # imported if a graph is running
    if module is None:
        return None
    try:
        return module.get_runtime()
    except (RuntimeError, KeyError):  # outside any runnable context, or outside a graph
        return None


class _Invocations:
    """A run id per LangGraph invocation, keyed by its ``RunControl``.

    LangGraph makes one ``RunControl`` per ``invoke``/``stream`` and hands it to every
    task and subgraph of it; it offers no id of its own unless the caller gives one.
    The control cannot be weakly referenced, so the most recent ones are held; while
    held, its ``id()`` cannot be reused by another.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._ids: OrderedDict[int, tuple[object, str]] = OrderedDict()

    def run_id(self, control: object) -> str:
        with self._lock:
            held = self._ids.get(id(control))
            if held is None or held[0] is not control:
                held = self._ids[id(control)] = (control, f"langgraph-{uuid.uuid4().hex}")
                if len(self._ids) > self._size:
                    self._ids.popitem(last=False)
            self._ids.move_to_end(id(control))
            return held[1]


_invocations = _Invocations()


@contextmanager
def _shown_to_the_model() -> Iterator[None]:
    """Turn a remote failure into the ``ToolException`` LangChain shows the model."""
    try:
        yield
    except BrokerUnavailable:
        raise
    except ToolCancelled as exc:
        raise ToolException(cancelled_text(exc)) from exc
    except RemoteToolError as exc:
        raise ToolException(str(exc)) from exc


def _content(result: Any) -> str:
    # JSON text, not the value: LangChain would read a list of strings as content blocks.
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
