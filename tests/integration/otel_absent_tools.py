"""A tool for ``test_without_opentelemetry.py``: says whether its worker can import
OpenTelemetry."""

from __future__ import annotations

import importlib
import os
from typing import Any

from executor import tool


@tool(queue="no-otel")
def otel_absent_echo(text: str) -> dict[str, Any]:
    """Return ``text``, the PID that ran it, and whether ``opentelemetry`` imports here.

    Args:
        text: Any text.
    """
    try:
        importlib.import_module("opentelemetry.trace")
    except ImportError:
        importable = False
    else:
        importable = True
    return {"text": text, "pid": os.getpid(), "opentelemetry": importable}
