"""A tool every worker of ``test_mixed_queue.py`` serves, on a queue of its own.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it.
"""

from __future__ import annotations

import os

from executor import tool

#: The queue both workers of the test consume.
QUEUE = "mixed"


@tool(queue=QUEUE)
def mixed_shared() -> int:
    """Return the pid of the pool process that ran the call."""
    return os.getpid()
