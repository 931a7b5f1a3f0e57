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
``status="error"`` and the run goes on. :class:`BrokerUnavailable` propagates: no
retry by the model can fix it.

This module imports ``langchain_core`` (the ``toolexec[langchain]`` extra), never
LangGraph; nothing imports it until ``as_langchain()`` is called.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agent_client.errors import BrokerUnavailable, RemoteToolError
from agent_client.frameworks import require
from agent_client.scope import current_run_id

require("langchain_core", extra="langchain", framework="LangChain")

# After the check above, so a missing extra says which one to install.
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool, ToolException

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = ["RUN_ID_KEY", "langchain_run_id", "langchain_tool"]

#: The ``configurable`` key that names the toolexec run explicitly.
RUN_ID_KEY = "toolexec_run_id"


def langchain_tool(remote: RemoteTool) -> StructuredTool:
    """Build the ``StructuredTool`` that runs ``remote`` on a worker."""

    # LangChain passes the tool's RunnableConfig to the parameter annotated with it;
    # the name keeps clear of any argument a tool may have.
    async def call(_toolexec_config: RunnableConfig, **arguments: Any) -> tuple[str, Any]:
        with _shown_to_the_model():
            result = await remote.invoke(arguments, run_id=langchain_run_id(_toolexec_config))
        return _content(result), result

    def call_sync(_toolexec_config: RunnableConfig, **arguments: Any) -> tuple[str, Any]:
        with _shown_to_the_model():
            result = remote.invoke_sync(arguments, run_id=langchain_run_id(_toolexec_config))
        return _content(result), result

    return StructuredTool(
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


def _langgraph_runtime() -> Any:
    """LangGraph's runtime of the graph running this tool, or None."""
    module = sys.modules.get("langgraph.runtime")  # imported if a graph is running
    if module is None:
        return None
    try:
        return module.get_runtime()
    except RuntimeError:  # called outside any runnable context
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
    except RemoteToolError as exc:
        raise ToolException(str(exc)) from exc


def _content(result: Any) -> str:
    # JSON text, not the value: LangChain would read a list of strings as content blocks.
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
