"""A tool that counts its runs outside Redis, for the Redis-restart tests.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. Each run appends its call id to a file before it sleeps: a count that
survives Redis going away, which a counter in Redis would not.
"""

from __future__ import annotations

import os
import time

from executor import current_call, tool


@tool(queue="restart")
def restart_nap(path: str, seconds: float) -> int:
    """Append this call's id to the file `path`, then sleep `seconds`; the process's PID.

    Args:
        path: The file to append to.
        seconds: How long to sleep.
    """
    with open(path, "a", encoding="utf-8") as runs:
        runs.write(f"{current_call().call_id} {os.getpid()} {time.time():.3f}\n")
    time.sleep(seconds)
    return os.getpid()
