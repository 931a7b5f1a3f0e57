"""Worker pools toolexec adds to Celery's, chosen through Celery's own mechanisms.

* :class:`~executor.pools.asyncio_pool.AsyncioPool`: one event loop per worker process
  runs up to ``-c N`` tool coroutines at once. Start it with
  ``CELERY_CUSTOM_WORKER_POOL=executor.pools.asyncio_pool:AsyncioPool celery -A executor
  worker -P custom -c N``, or with ``TOOLEXEC_WORKER_POOL=asyncio celery -A executor
  worker -c N``: the app then sets Celery's ``worker_pool`` to :data:`ASYNCIO_POOL`, the
  pool a worker runs when its command line names none (Celery's ``-P prefork``, its
  default, yields to it too).

The asyncio pool's modules, one concept each:

* ``asyncio_pool``: the pool (Celery's pool interface, the loop thread and its inbox,
  the ``-c N`` slots a request waits for, shutdown);
* ``trace``: an async task body run on the loop as Celery's trace would run it;
* ``offload``: the I/O threads that run a body's blocking steps (Redis round trips)
  and hand their results back to the loop in batches.

This package imports nothing itself: Celery imports the pool by its path.
"""

from __future__ import annotations

__all__ = ["ASYNCIO_POOL", "WORKER_POOLS"]

#: Where Celery finds the asyncio pool (``worker_pool``, or ``CELERY_CUSTOM_WORKER_POOL``).
ASYNCIO_POOL = "executor.pools.asyncio_pool:AsyncioPool"

#: ``TOOLEXEC_WORKER_POOL`` -> Celery's ``worker_pool``: Celery's own names, and asyncio.
WORKER_POOLS = {
    "prefork": "prefork",
    "threads": "threads",
    "solo": "solo",
    "asyncio": ASYNCIO_POOL,
}
