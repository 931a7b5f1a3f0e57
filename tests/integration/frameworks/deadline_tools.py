"""A tool with a default deadline of its own, for the framework deadline tests.

Workers import this module through ``TOOLEXEC_TOOL_MODULES`` (the framework worker of
``conftest.py``); the test process never needs to.
"""

from __future__ import annotations

from typing import Any

from executor import current_call, tool

#: The tool's own ``@tool(timeout=)``: what a call gets when nothing above it is set.
OWN_TIMEOUT = 7.0


@tool(timeout=OWN_TIMEOUT)
def own_deadline() -> dict[str, Any]:
    """Report the deadline and run this call was given (its own default deadline is 7 s)."""
    call = current_call()
    return {"time_left": call.time_left(), "run_id": call.run_id}
