"""toolexec's worker side: register tools with ``@tool`` and serve them with Celery.

``celery -A executor worker`` finds :data:`app` here. The app is built on first access
(not at import), so the agent side, which imports only ``executor.protocol`` and
``executor.settings``, never builds a Celery app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from executor.context import CallContext, current_call
from executor.errors import ConfigurationError, ToolDefinitionError, ToolexecError
from executor.protocol import CallOutcome, CallRequest, ErrorInfo, ErrorKind, ToolSpec
from executor.registry import ToolDefinition, get_tool, registered_tools, tool
from executor.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

    app: Celery

__all__ = [
    "CallContext",
    "CallOutcome",
    "CallRequest",
    "ConfigurationError",
    "ErrorInfo",
    "ErrorKind",
    # Configuration
    "Settings",
    "ToolDefinition",
    "ToolDefinitionError",
    # Wire protocol
    "ToolSpec",
    # Errors
    "ToolexecError",
    # The Celery app (built on first access)
    "app",
    "current_call",
    "get_tool",
    "registered_tools",
    # Defining tools
    "tool",
]


def __getattr__(name: str) -> Any:
    if name == "app":
        from executor.celery_app import get_app

        return get_app()
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
