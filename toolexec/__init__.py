"""toolexec's ops side: the ``toolexec`` command, the demo, private servers and workers.

This package may import both sides (``executor`` and ``agent_client``) and the wire
contract; neither side imports it.
"""

from __future__ import annotations

from toolexec.errors import LaunchError, ProcessStartFailed, ServerBinaryNotFound
from toolexec.process import ChildProcess, free_port
from toolexec.redis_server import RedisServer, find_redis_server
from toolexec.worker_process import Pool, WorkerProcess, celery_worker_argv

__all__ = [
    # Processes
    "ChildProcess",
    "RedisServer",
    "WorkerProcess",
    "Pool",
    "celery_worker_argv",
    "find_redis_server",
    "free_port",
    # Errors
    "LaunchError",
    "ProcessStartFailed",
    "ServerBinaryNotFound",
]
