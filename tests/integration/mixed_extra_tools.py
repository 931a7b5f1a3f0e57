"""A tool only one of ``test_mixed_queue.py``'s two workers on the ``mixed`` queue serves.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it.
"""

from __future__ import annotations

import os

from executor import tool


@tool(queue="mixed")
def mixed_extra() -> int:
    """Return the pid of the pool process that ran the call."""
    return os.getpid()
