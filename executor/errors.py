"""Errors raised on the worker side.

```
ToolexecError                  (wire.errors)
├── ConfigurationError         a setting has a value toolexec cannot use (wire.errors)
└── ToolDefinitionError        a @tool cannot be registered (raised at import)
```

Failures of a call never cross the wire as these: a worker turns them into an
:class:`~wire.models.ErrorInfo`.
"""

from __future__ import annotations

from wire.errors import ToolexecError

__all__ = ["ToolDefinitionError"]


class ToolDefinitionError(ToolexecError, TypeError):
    """A tool cannot be registered as written; the message says what to change."""
