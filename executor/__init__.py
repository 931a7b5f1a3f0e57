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
    # Defining tools
    "tool",
    "current_call",
    "CallContext",
    "ToolDefinition",
    "get_tool",
    "registered_tools",
    # Wire protocol
    "ToolSpec",
    "CallRequest",
    "CallOutcome",
    "ErrorInfo",
    "ErrorKind",
    # Configuration
    "Settings",
    # Errors
    "ToolexecError",
    "ToolDefinitionError",
    "ConfigurationError",
    # The Celery app (built on first access)
    "app",
]


def __getattr__(name: str) -> Any:
    if name == "app":
        from executor.celery_app import get_app

        return get_app()
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
