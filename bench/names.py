"""Every queue name and Redis key the benchmark uses, in one place.

toolexec's own keys live in :mod:`wire.keys`; these are the benchmark's, all under
``bench:`` or in queues that no toolexec deployment uses.
"""

from __future__ import annotations

__all__ = [
    "ASYNC_QUEUE",
    "POOL_QUEUE",
    "RAW_PREFETCH1_QUEUE",
    "RAW_QUEUE",
    "RAW_SHED_QUEUE",
    "RPC_REQUESTS",
    "SCALE_QUEUES",
    "SHED_BUSY",
    "SHED_QUEUE",
    "SHED_RAN",
    "SHED_RAN_RAW",
    "TOOLEXEC_QUEUE",
    "VOID_QUEUE",
    "rpc_reply",
    "scale_queue",
    "scale_tool",
]

#: The queue the main toolexec worker serves (toolexec's default queue).
TOOLEXEC_QUEUE = "default"
#: The queue the plain Celery worker serves.
RAW_QUEUE = "bench_raw"
#: The queue of the throughput scenario's plain Celery worker with prefetch multiplier 1.
RAW_PREFETCH1_QUEUE = "bench_raw_prefetch1"
#: A queue no worker consumes: a Celery call sent there can only time out.
VOID_QUEUE = "bench_void"

#: The queue of the async-tools scenario's worker (one pool at a time).
ASYNC_QUEUE = "bench_async"

#: The queue of the throughput scenario's toolexec worker on a second pool.
POOL_QUEUE = "bench_pool"

#: Queues of the shedding scenario's single-process workers.
SHED_QUEUE = "bench_shed"
RAW_SHED_QUEUE = "bench_raw_shed"
#: Counters of shed-marker calls that ran anyway (toolexec, plain Celery).
SHED_RAN = "bench:shed:ran"
SHED_RAN_RAW = "bench:shed:ran_raw"
#: Set while the shedding scenario's busy call runs.
SHED_BUSY = "bench:shed:busy"

#: The hand-written RPC server's request list.
RPC_REQUESTS = "bench:rpc:requests"

#: Worker counts of the scaling scenario; each has its own queue and tool.
SCALE_QUEUES = (1, 2, 4)


def rpc_reply(client_id: str) -> str:
    """Reply list of one hand-written RPC client."""
    return f"bench:rpc:reply:{client_id}"


def scale_queue(processes: int) -> str:
    """Queue that exactly ``processes`` scaling workers consume."""
    return f"bench_scale{processes}"


def scale_tool(processes: int) -> str:
    """The 50 ms tool registered on :func:`scale_queue` ``(processes)``."""
    return f"scale{processes}_sleep_ms"
