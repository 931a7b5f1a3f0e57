"""A tool's progress as MCP ``notifications/progress``.

A request with ``_meta.progressToken`` gets ``notifications/progress`` for each report
the tool makes (``executor.report_progress``), before its result: ``progress`` is the
tool's ``done``, with its ``total`` and ``message``. MCP wants ``progress`` to
increase, so a report that does not go beyond the last one sent is not forwarded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent_client import ProgressEvent
from toolexec.mcp.meta import Context

__all__ = ["ProgressForwarder", "forward_progress", "progress_forwarder"]

#: Forwards (progress, total, message) to the client; see :func:`progress_forwarder`.
ProgressForwarder = Callable[[float, float | None, str | None], Awaitable[None]]


def progress_forwarder(ctx: Context) -> ProgressForwarder | None:
    """The callback that forwards a tool's progress to the client, or None if it asked for none.

    A client asks with ``_meta.progressToken``, and this returns what sends
    ``notifications/progress`` against that token; ``tools/call`` hands each of the
    tool's reports to it through :func:`forward_progress`.
    """
    meta: Mapping[str, Any] = ctx.meta or {}  # mcp parses progressToken as progress_token
    if meta.get("progress_token") is None:
        return None
    return ctx.session.report_progress


def forward_progress(forward: ProgressForwarder) -> Callable[[ProgressEvent], Awaitable[None]]:
    """``RemoteTool.invoke``'s ``on_progress``: each report that goes beyond the last, forwarded."""
    sent: list[float] = []

    async def on_progress(event: ProgressEvent) -> None:
        if sent and event.done <= sent[-1]:
            return
        sent[:] = [event.done]
        await forward(event.done, event.total, event.message)

    return on_progress
