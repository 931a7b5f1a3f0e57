"""Errors that both sides share: the base of toolexec's own errors and bad settings.

```
ToolexecError
└── ConfigurationError     a setting has a value toolexec cannot use
```

The worker adds ``ToolDefinitionError`` (``executor.errors``) and the ops package adds
``LaunchError`` (``toolexec.errors``) under the same base. Failures of a call never
cross the wire as exceptions: they travel as :class:`~wire.models.ErrorInfo` data, and
the agent raises them as ``agent_client.RemoteToolError``.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "ToolexecError"]


class ToolexecError(Exception):
    """Base of toolexec's own errors (not of call failures)."""


class ConfigurationError(ToolexecError, ValueError):
    """A setting has a value toolexec cannot use; the message names the variable."""
