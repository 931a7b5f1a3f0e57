"""Who this worker process is: the worker id its heartbeat uses and its holder tag.

A call that starts records a *holder* (:func:`wire.formats.holder_tag`) in Redis, so a
waiting client, or a redelivery, can tell whether the process running it is alive.
"""

from __future__ import annotations

import os

from wire.formats import holder_tag

__all__ = ["holder", "in_pool_child", "mark_main_process", "worker_id"]

_main_pid: int | None = None


def mark_main_process() -> None:
    """Record this process as the worker's main process (before the pool forks)."""
    global _main_pid
    _main_pid = os.getpid()


def in_pool_child() -> bool:
    """Whether this process is a prefork pool child of a worker, not the worker itself.

    On the solo and threads pools, tools run in the worker's main process.
    """
    return _main_pid is not None and os.getpid() != _main_pid


def worker_id(hostname: str) -> str:
    """The id of the worker this process belongs to: ``<node name>:<main pid>``."""
    return f"{hostname}:{_main_pid if _main_pid is not None else os.getpid()}"


def holder(hostname: str, pid: int | None = None) -> str:
    """The holder tag of process ``pid`` of this worker (default: this process)."""
    return holder_tag(worker_id(hostname), os.getpid() if pid is None else pid)
