"""toolexec's wire contract: what workers and agent clients agree on.

Both sides import this package, and it imports neither. It holds the data that crosses
Redis (:mod:`wire.models`), the settings both sides read (:mod:`wire.settings`), every
Redis key and TTL rule (:mod:`wire.keys`), the Celery message (:mod:`wire.message`),
every Lua script (:mod:`wire.scripts`), every string format (:mod:`wire.formats`) and
the one table of URL schemes (:mod:`wire.urls`).
"""

from __future__ import annotations

from wire.errors import ConfigurationError, ToolexecError
from wire.models import (
    TASK_AT_LEAST_ONCE,
    TASK_AT_MOST_ONCE,
    CallOutcome,
    CallRequest,
    Delivery,
    ErrorInfo,
    ErrorKind,
    ToolSpec,
    WorkerInfo,
    should_store,
    task_name_for,
)
from wire.settings import ENVIRONMENT_VARIABLES, Settings

__all__ = [
    # Models
    "CallOutcome",
    "CallRequest",
    "Delivery",
    "ErrorInfo",
    "ErrorKind",
    "ToolSpec",
    "WorkerInfo",
    "should_store",
    # Celery task names
    "TASK_AT_LEAST_ONCE",
    "TASK_AT_MOST_ONCE",
    "task_name_for",
    # Settings
    "ENVIRONMENT_VARIABLES",
    "Settings",
    # Errors
    "ConfigurationError",
    "ToolexecError",
]
