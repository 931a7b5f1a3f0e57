"""toolexec's agent side: call tools that run on Celery workers.

from agent_client import remote_tool
search = remote_tool("search")
hits = search(query="red-headed league")          # or: await search.run(...)
agent = lazybridge.Agent(tools=[search], ...)     # a LazyBridge ToolProvider
"""

from __future__ import annotations

from agent_client.calls import SentCall, sent_calls
from agent_client.client import ToolClient, configure, get_client
from agent_client.deadline import NOT_SET, NotSet
from agent_client.errors import (
    BrokerUnavailable,
    CallerGone,
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolCancelled,
    ToolExecutionError,
    ToolNotFound,
    ToolOutcomeUnknown,
    ToolTimeoutError,
    WorkerLost,
)
from agent_client.handles import CallHandle, CallNotFound, attach
from agent_client.progress import ProgressEvent, ToolResult
from agent_client.remote import RemoteTool, remote_tool
from agent_client.runs import current_run_id, run_scope
from agent_client.toolset import RemoteToolset, remote_tools
from wire.errors import ToolexecError

__all__ = [
    # Proxies
    "remote_tool",
    "remote_tools",
    "RemoteTool",
    "RemoteToolset",
    # Handles
    "CallHandle",
    "attach",
    # Runs
    "run_scope",
    "current_run_id",
    # Call ids
    "sent_calls",
    "SentCall",
    # Deadlines
    "NOT_SET",
    "NotSet",
    # Progress
    "ProgressEvent",
    "ToolResult",
    # The process's client
    "ToolClient",
    "configure",
    "get_client",
    # Errors
    "ToolexecError",
    "RemoteToolError",
    "ToolNotFound",
    "ToolArgumentsInvalid",
    "ToolExecutionError",
    "ToolTimeoutError",
    "WorkerLost",
    "ToolOutcomeUnknown",
    "ToolCancelled",
    "CallerGone",
    "CallNotFound",
    "BrokerUnavailable",
]
