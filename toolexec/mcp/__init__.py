"""``toolexec mcp``: the live tool catalog as a Model Context Protocol server.

``toolexec mcp`` serves over stdio (an MCP client launches it as a subprocess);
``toolexec mcp --http PORT`` serves streamable HTTP at ``http://127.0.0.1:PORT/mcp``
(``--host`` to bind elsewhere). It is mcp's low-level ``Server`` with its handlers over
this process's :class:`~agent_client.ToolClient`; both protocol eras mcp 2.x speaks are
served: the ``initialize`` handshake (2025 versions) and per-request envelopes
(2026-07-28).

* :mod:`~toolexec.mcp.server` — :class:`ToolexecMCP`: the server, its handlers and its
  ``tools.listChanged`` announcements; :func:`serve_stdio` and :func:`serve_http`;
* :mod:`~toolexec.mcp.listing` — ``tools/list``, and the watcher that notices a changed
  catalog;
* :mod:`~toolexec.mcp.calling` — ``tools/call``: the call, its result as
  ``structuredContent``, failures as error results;
* :mod:`~toolexec.mcp.meta` — what a request's ``_meta`` may set: its run
  (:data:`RUN_ID_META_KEY`) and its deadline (:data:`TIMEOUT_META_KEY`); what a listed
  tool's says (:data:`REQUIRES_APPROVAL_META_KEY`);
* :mod:`~toolexec.mcp.sessions` — one run per MCP session, and how to notify each;
* :mod:`~toolexec.mcp.progress` — a tool's reports as ``notifications/progress``;
* :mod:`~toolexec.mcp.tasks` — MCP's tasks extension (:data:`TASKS_EXTENSION`): a call
  as a task, by its toolexec call id; :mod:`~toolexec.mcp.task_requests` — its
  ``tasks/get``, ``tasks/update``, ``tasks/cancel`` and ``notifications/tasks``.

This package imports mcp (the ``toolexec[mcp]`` extra); ``toolexec mcp`` imports it.
Without the extra, importing it raises ``MissingExtra`` naming the extra.
"""

from __future__ import annotations

from agent_client.frameworks import require

require("mcp", extra="mcp", framework="toolexec mcp (the MCP server)")

# After require(), which names the extra if mcp is missing.
from toolexec.mcp.calling import structured
from toolexec.mcp.meta import (
    CALL_ID_META_KEY,
    REQUIRES_APPROVAL_META_KEY,
    RUN_ID_META_KEY,
    TIMEOUT_META_KEY,
)
from toolexec.mcp.progress import ProgressForwarder, progress_forwarder
from toolexec.mcp.server import ToolexecMCP, serve_http, serve_stdio
from toolexec.mcp.sessions import MAX_SESSIONS
from toolexec.mcp.tasks import MAX_TASKS, TASKS_EXTENSION

__all__ = [
    # Serving
    "ToolexecMCP",
    "serve_http",
    "serve_stdio",
    # What a client sets and gets
    "RUN_ID_META_KEY",
    "TIMEOUT_META_KEY",
    "REQUIRES_APPROVAL_META_KEY",
    "CALL_ID_META_KEY",
    "TASKS_EXTENSION",
    "structured",
    # Limits and seams
    "MAX_SESSIONS",
    "MAX_TASKS",
    "ProgressForwarder",
    "progress_forwarder",
]
