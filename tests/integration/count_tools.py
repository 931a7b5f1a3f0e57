"""No-op tools whose calls send Redis nothing of their own: ``test_command_counts.py``
counts the commands of the call path alone.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Both tools are on the ``counted`` queue, which only that test's worker
consumes.
"""

from __future__ import annotations

from executor import tool

QUEUE = "counted"


@tool(queue=QUEUE)
def counted_noop() -> None:
    """Do nothing: a plain call."""


@tool(idempotent=True, queue=QUEUE)
def counted_noop_idempotent(key: int) -> int:
    """Do nothing and return ``key``: every key a first call of its own."""
    return key
