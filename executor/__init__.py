"""toolexec's worker side: register tools with ``@tool`` and serve them with Celery.

``celery -A executor worker`` finds :data:`app` here. The app is built on first access
(not at import), so importing a tool module never builds a Celery app. The agent side
never imports this package: what both sides share lives in :mod:`wire`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from executor.context import CallContext, current_call, report_progress
from executor.errors import ToolDefinitionError
from executor.registry import ToolDefinition, get_tool, registered_tools, tool

if TYPE_CHECKING:
    from celery import Celery

    app: Celery

__all__ = [
    # Defining tools
    "tool",
    "ToolDefinition",
    "get_tool",
    "registered_tools",
    # Inside a tool
    "CallContext",
    "current_call",
    "report_progress",
    # Errors
    "ToolDefinitionError",
    # The Celery app (built on first access)
    "app",
]


def __getattr__(name: str) -> Any:
    if name == "app":
        from executor.seams.app import get_app

        return get_app()
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
