"""Tools the MCP tasks tests (``test_mcp_tasks.py``) load into their own worker.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Every tool is on the ``mcp_tasks`` queue, which only that worker consumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from executor import current_call, report_progress, tool

#: The queue of every tool here.
QUEUE = "mcp_tasks"


@tool(queue=QUEUE)
def task_steps(steps: int, pause: float, marker: str | None = None) -> dict[str, Any]:
    """Report `steps` steps of progress, `pause` seconds apart; then write the file `marker`.

    A cancelled call stops at its next step and never writes the file.

    Args:
        steps: How many steps.
        pause: Seconds after each step.
        marker: A file written once the last step is done.
    """
    cancelled = current_call().cancelled
    for step in range(1, steps + 1):
        report_progress(step, steps, f"step {step}")
        if cancelled.wait(pause):
            return {"stopped_at": step}
    if marker:
        Path(marker).write_text("done")
    return {"steps": steps}


@tool(queue=QUEUE)
def task_fail(message: str) -> None:
    """Raise ``ValueError(message)``.

    Args:
        message: The error's message.
    """
    raise ValueError(message)


@tool(queue=QUEUE)
def task_echo(text: str) -> dict[str, str]:
    """Return `text`.

    Args:
        text: What to return.
    """
    return {"text": text}
