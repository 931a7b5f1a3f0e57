"""Who this worker process is: the worker id its heartbeat uses and its holder tag.

A call that starts records a *holder* (``<worker id>|<pid>``) in Redis, so a waiting
client, or a redelivery, can tell whether the process running it is still alive.
"""

from __future__ import annotations

import os

__all__ = ["holder", "mark_main_process", "parse_holder", "worker_id"]

_main_pid: int | None = None


def mark_main_process() -> None:
    """Record this process as the worker's main process (before the pool forks)."""
    global _main_pid
    _main_pid = os.getpid()


def worker_id(hostname: str) -> str:
    """The id of the worker this process belongs to: ``<node name>:<main pid>``."""
    return f"{hostname}:{_main_pid if _main_pid is not None else os.getpid()}"


def holder(hostname: str) -> str:
    """This process's holder tag: ``<worker id>|<pid>``."""
    return f"{worker_id(hostname)}|{os.getpid()}"


def parse_holder(tag: str) -> tuple[str, int]:
    """Split a holder tag into the worker id and the pid (0 if malformed)."""
    wid, _, pid = tag.rpartition("|")
    return (wid, int(pid)) if pid.isdigit() else (tag, 0)
