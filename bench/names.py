"""Every queue name and Redis key the benchmark uses, in one place.

toolexec's own keys live in :mod:`wire.keys`; these are the benchmark's, all under
``bench:`` or in queues that no toolexec deployment uses.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ARQ_QUEUE",
    "ASYNC_QUEUE",
    "DRAMATIQ_NAMESPACE",
    "DRAMATIQ_QUEUE",
    "DRAMATIQ_RESULTS",
    "EVENTS_WORKERS",
    "LOOP_READS",
    "RUN_LOG",
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
    "SIZING_IDEMPOTENT",
    "SIZING_PLAIN",
    "SIZING_QUEUE",
    "TASKIQ_RESULTS",
    "TASKIQ_STREAM",
    "TOOLEXEC_QUEUE",
    "VOID_QUEUE",
    "events_queue",
    "events_tool",
    "reads_queue",
    "reads_tool",
    "runlog_queue",
    "runlog_tool",
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

#: The peers of scenario 11 (bench/peers/): Dramatiq's key namespace, queue and
#: result namespace; arq's queue (its job and result keys are arq's own ``arq:job:``
#: and ``arq:result:``); taskiq's stream and its result keys' prefix.
DRAMATIQ_NAMESPACE = "bench:dramatiq"
DRAMATIQ_QUEUE = "bench_dramatiq"
DRAMATIQ_RESULTS = "bench:dramatiq-results"
ARQ_QUEUE = "bench:arq:queue"
TASKIQ_STREAM = "bench:taskiq"
TASKIQ_RESULTS = "bench:taskiq-results"

#: Worker counts of the scaling scenario; each has its own queue and tool.
SCALE_QUEUES = (1, 2, 4)

#: The workers of the task-events scenario (12): each pool with task events on and off
#: (``TOOLEXEC_TASK_EVENTS`` ``on`` and ``auto``); each has its own queue and no-op.
EVENTS_WORKERS: tuple[tuple[Literal["prefork", "asyncio"], Literal["on", "auto"]], ...] = (
    ("prefork", "on"),
    ("prefork", "auto"),
    ("asyncio", "on"),
    ("asyncio", "auto"),
)


def rpc_reply(client_id: str) -> str:
    """Reply list of one hand-written RPC client."""
    return f"bench:rpc:reply:{client_id}"


def scale_queue(processes: int) -> str:
    """Queue that exactly ``processes`` scaling workers consume."""
    return f"bench_scale{processes}"


#: Scenario 15's queue (Redis CPU per call), and its two no-ops: plain and idempotent.
SIZING_QUEUE = "bench_sizing"
SIZING_PLAIN = "sizing_noop"
SIZING_IDEMPOTENT = "sizing_noop_idempotent"


#: The values of TOOLEXEC_LOOP_READS scenario 14 compares, on the asyncio pool.
LOOP_READS: tuple[str, ...] = ("true", "false")


def reads_queue(mode: str) -> str:
    """Queue of scenario 14's worker with ``TOOLEXEC_LOOP_READS=mode``."""
    return f"bench_reads_{mode}"


def reads_tool(mode: str) -> str:
    """The no-op registered on :func:`reads_queue` ``(mode)``."""
    return f"reads_{mode}_noop"


#: The values of TOOLEXEC_RUN_LOG scenario 16 compares, on the asyncio pool.
RUN_LOG: tuple[str, ...] = ("on", "off")


def runlog_queue(mode: str) -> str:
    """Queue of scenario 16's worker with ``TOOLEXEC_RUN_LOG=mode``."""
    return f"bench_runlog_{mode}"


def runlog_tool(mode: str) -> str:
    """The no-op registered on :func:`runlog_queue` ``(mode)``."""
    return f"runlog_{mode}_noop"


def events_queue(pool: str, events: str) -> str:
    """Queue of the task-events scenario's worker on ``pool`` with
    ``TOOLEXEC_TASK_EVENTS=events``."""
    return f"bench_events_{pool}_{events}"


def events_tool(pool: str, events: str) -> str:
    """The no-op registered on :func:`events_queue` ``(pool, events)``."""
    return f"events_{pool}_{events}_noop"


def scale_tool(processes: int) -> str:
    """The 50 ms tool registered on :func:`scale_queue` ``(processes)``."""
    return f"scale{processes}_sleep_ms"
