"""The tool the task-events tests (test_task_events) load into real workers.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Its tool is on the ``task_events`` queue, which only those tests' workers
consume.
"""

from __future__ import annotations

from executor import tool

#: The queue of the tool here.
QUEUE = "task_events"


@tool(queue=QUEUE)
def echo_event(word: str) -> str:
    """Return ``word``: one call, one set of task events when they are on.

    Args:
        word: Any text.
    """
    return word
