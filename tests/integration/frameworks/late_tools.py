"""A tool on its own queue, for the MCP test whose worker starts after the server read the catalog.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. The ``late`` queue is this tool's alone, so the catalog has it only once
that worker has started.
"""

from __future__ import annotations

import time

from executor import tool


@tool(queue="late")
def late_sleep(seconds: float) -> float:
    """Sleep for `seconds`, then return them.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return seconds
