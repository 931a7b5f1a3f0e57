"""Test-only tools for the LazyBridge and example tests."""

from __future__ import annotations

from typing import Any

from executor import current_call, tool


@tool
def call_context() -> dict[str, Any]:
    """Report the deadline and run this call was given."""
    call = current_call()
    return {"time_left": call.time_left(), "run_id": call.run_id}


@tool
def raises_timeout() -> None:
    """Fail the way a client whose own deadline passed does: raise TimeoutError."""
    raise TimeoutError("upstream took too long")
