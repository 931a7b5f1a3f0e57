"""Tools of the failover tests (``test_sentinel.py``): each run leaves a line in a file.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
imports it. A run's side effect is a line in ``runs.log`` under ``TOOLEXEC_DATA_DIR``,
appended in one write (atomic between processes for a line this short), never in Redis:
the Redis they run beside is what the tests kill.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from executor import tool
from wire.settings import Settings

#: The file of runs, one line per run: ``<tool> <key>``.
RUNS = "runs.log"


@functools.cache
def _runs() -> Path:
    return Path(Settings.from_env().data_dir) / RUNS


def _ran(tool_name: str, key: str) -> None:
    path = _runs()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{tool_name} {key}\n".encode())
    finally:
        os.close(fd)


@tool(idempotent=True)
def failover_book(key: str) -> str:
    """Book ``key`` once: an idempotent side effect."""
    _ran("failover_book", key)
    return key


@tool
def failover_echo(key: str) -> str:
    """Return ``key``: a plain call."""
    _ran("failover_echo", key)
    return key
