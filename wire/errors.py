"""Errors that both sides share: the base of toolexec's own errors and bad settings.

```
ToolexecError
└── ConfigurationError     a setting has a value toolexec cannot use
```

The worker adds ``ToolDefinitionError`` (``executor.errors``), the ops package
``LaunchError`` (``toolexec.errors``) and the agent ``RemoteToolError``, the base of a
call's failures (``agent_client.errors``), under the same base: ``except ToolexecError``
catches every error toolexec raises. Failures of a call never cross the wire as
exceptions: they travel as :class:`~wire.models.ErrorInfo` data, and the agent raises
them as ``RemoteToolError``.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "ToolexecError"]


class ToolexecError(Exception):
    """Base of every error toolexec raises: its own (settings, definitions, launches) and,
    through ``agent_client.RemoteToolError``, a remote call's failures."""


class ConfigurationError(ToolexecError, ValueError):
    """A setting has a value toolexec cannot use; the message names the variable."""
