"""What the fault tests share: the fault tools' worker environment and process readings."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["FAULT_QUEUE", "cpu_seconds", "fault_env", "unique"]

#: The queue the fault tools (``tests/integration/fault_tools.py``) are served on.
FAULT_QUEUE = "faults"
#: Tool modules of a worker that serves the fault tools.
FAULT_TOOL_MODULES = "tests.integration.fault_tools"


def fault_env(settings_env: dict[str, str], **extra: str) -> dict[str, str]:
    """The session's worker environment with the fault tools and ``extra`` variables."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": FAULT_TOOL_MODULES, **extra}


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}:{uuid.uuid4().hex[:12]}"


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time (user + system) process ``pid`` and its threads have used; Linux only.

    With ``thread`` (a native thread id of that process), the time of that thread alone.
    """
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rpartition(")")[2].split()
    # After the name: state is field 3 (index 0 here); utime and stime are fields 14, 15.
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
