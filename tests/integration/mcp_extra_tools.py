"""A tool on its own queue, for the MCP test's worker that joins and leaves.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Every worker on a queue must serve the same tools, so this tool has the
``mcp_extra`` queue to itself: the worker serving it adds a tool to the catalog when
it starts and takes it away when it stops.
"""

from __future__ import annotations

from executor import tool


@tool(queue="mcp_extra")
def mcp_extra_echo(text: str) -> str:
    """Return `text` unchanged.

    Args:
        text: Any text.
    """
    return text
