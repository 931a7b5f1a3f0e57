"""arq as its documentation sets it up: one asyncio worker process, results kept in Redis.

``python -m bench.peers.arq_app`` runs the worker (:func:`worker_argv`) with arq's
``run_worker`` on the settings of :func:`worker_settings`; :class:`Client` enqueues the
no-op with ``enqueue_job`` and waits with ``job.result(poll_delay=)``. Both use an
``ArqRedis``, the client ``create_pool`` makes, on a larger pool (:data:`MAX_CONNECTIONS`).
arq polls on both sides: the worker its queue (a sorted set) every ``poll_delay``, the
client each job's result key. Its defaults (0.5 s) are for background jobs, not round
trips: the worker here polls every :data:`POLL_DELAY`, the client at
:func:`bench.peers.calls.result_poll`.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any

from arq.connections import ArqRedis
from arq.jobs import ResultNotFound
from arq.worker import run_worker
from redis.asyncio import ConnectionPool

from bench import names
from bench.peers.calls import result_poll
from wire.settings import Settings

__all__ = [
    "FUNCTION",
    "MAX_JOBS",
    "POLL_DELAY",
    "Client",
    "describe",
    "worker_argv",
    "worker_settings",
]

#: Jobs the worker runs at once: the asyncio pool's -c 100 (arq's default is 10).
MAX_JOBS = 100
#: Seconds between the worker's polls of its queue (arq's default is 0.5). Idle, a poll
#: costs arq about 0.16 ms of CPU: 16% of a core at 1 ms, 3% at 5 ms, on a machine the
#: other sides share. Under load a poll takes up to max_jobs jobs, so 5 ms caps nothing
#: there; one call at a time it adds 2.5 ms on average.
POLL_DELAY = 0.005
#: The no-op's name as arq registers it (the function's name).
FUNCTION = "noop"
#: Connections each side's pool may open. arq 0.25's ``RedisSettings`` has no
#: ``max_connections``, and redis-py 8's asyncio pool refuses a 101st connection by
#: default: one per call in flight (1,000), and the worker's 100 jobs, need more.
MAX_CONNECTIONS = 2000


async def noop(ctx: dict[str, Any]) -> None:
    """The no-op job."""
    return


def _pool(url: str) -> ArqRedis:
    # What arq's create_pool() makes, on a pool of MAX_CONNECTIONS.
    pool = ConnectionPool.from_url(url, max_connections=MAX_CONNECTIONS)
    return ArqRedis(pool, default_queue_name=names.ARQ_QUEUE)


def worker_settings(url: str) -> dict[str, Any]:
    """The worker's settings (arq's ``WorkerSettings`` as a dict)."""
    return {
        "functions": [noop],
        "redis_pool": _pool(url),
        "queue_name": names.ARQ_QUEUE,
        "max_jobs": MAX_JOBS,
        "poll_delay": POLL_DELAY,
    }


def worker_argv() -> list[str]:
    """The worker's command line."""
    return [sys.executable, "-m", __name__]


def describe() -> tuple[str, str, str]:
    """Label, worker and client as scenario 11 states them."""
    return (
        f"arq {metadata.version('arq')}",
        (
            f"one process (arq runs one per worker), max_jobs {MAX_JOBS}, poll_delay "
            f"{POLL_DELAY * 1000:g} ms (default 0.5 s), default serializer (pickle) and "
            f"keep_result, pools of up to {MAX_CONNECTIONS:,} connections"
        ),
        (
            "`enqueue_job()`; N coroutines; `job.result(poll_delay=)`: "
            f"{result_poll(1) * 1000:g} ms at 1, {result_poll(100) * 1000:g} ms at 100, "
            f"{result_poll(1000) * 1000:g} ms at 1,000 in flight"
        ),
    )


class Client:
    """The benchmark's arq client: one pool on the benchmark's loop."""

    def __init__(self, pool: ArqRedis) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, url: str) -> Client:
        """Connect (on the loop the calls will run on)."""
        pool = _pool(url)
        await pool.ping()
        return cls(pool)

    async def call(self, poll: float, timeout: float) -> object:
        """Enqueue the no-op and wait for its result, polling every ``poll`` seconds."""
        job = await self._pool.enqueue_job(FUNCTION)
        if job is None:  # only for a job id that is already queued; ids here are random
            raise RuntimeError("arq did not enqueue the job")
        try:
            return await job.result(timeout=timeout, poll_delay=poll)
        except ResultNotFound:
            # arq 0.25 reads the result, then the queue, in two round trips (0.26 made
            # them one transaction): a job that finishes between the two reads as not
            # found. Its result is stored by then; the next read finds it.
            return await job.result(timeout=timeout, poll_delay=poll)

    async def aclose(self) -> None:
        """Close the pool."""
        await self._pool.aclose()


def main() -> None:
    """Run the worker until SIGTERM (arq's own signal handling)."""
    run_worker(worker_settings(Settings.from_env().redis_url))


if __name__ == "__main__":
    main()
