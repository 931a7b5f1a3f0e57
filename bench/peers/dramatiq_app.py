"""Dramatiq as its documentation sets it up: a Redis broker and the Results middleware.

``python -m dramatiq bench.peers.dramatiq_app:setup --processes 2 --threads 8`` runs the
worker (:func:`worker_argv`): Dramatiq's own command, whose main process starts the
worker processes, each with its worker threads. ``setup`` builds the broker from the
workers' environment and declares the no-op actor on it; :class:`Client` declares the
same actor on a broker of its own, sends, and waits for each result with
``message.get_result(block=True)`` (a ``BRPOPLPUSH`` on the result's key).

Dramatiq is imported inside the functions only: importing it imports gevent (see
:mod:`bench.peers`).
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any, cast

from bench import names
from wire.settings import Settings

if TYPE_CHECKING:
    from dramatiq import Actor, Message
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results.backends import RedisBackend

__all__ = ["ACTOR", "PROCESSES", "THREADS", "Client", "describe", "setup", "worker_argv"]

#: Worker processes and threads per process: Dramatiq's defaults on a 2-core machine
#: (``--processes`` defaults to the CPU count, ``--threads`` to 8), stated explicitly.
PROCESSES = 2
THREADS = 8
#: The no-op actor's name.
ACTOR = "bench_noop"
#: How long a result is kept (Dramatiq's default result_ttl is 10 minutes).
_RESULT_TTL_MS = 600_000


def _noop() -> None:
    return None


def _create(url: str) -> tuple[RedisBroker, RedisBackend, Actor[[], None]]:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    backend = RedisBackend(url=url, namespace=names.DRAMATIQ_RESULTS)
    broker = RedisBroker(url=url, namespace=names.DRAMATIQ_NAMESPACE)  # type: ignore[no-untyped-call]
    results = Results(backend=backend, store_results=True, result_ttl=_RESULT_TTL_MS)  # type: ignore[no-untyped-call]
    broker.add_middleware(results)
    actor = dramatiq.actor(actor_name=ACTOR, queue_name=names.DRAMATIQ_QUEUE, broker=broker)
    return broker, backend, cast("Actor[[], None]", actor(_noop))


def setup() -> None:
    """Dramatiq's command calls this in each worker process: the broker and the actor."""
    import dramatiq

    broker, _, _ = _create(Settings.from_env().redis_url)
    dramatiq.set_broker(broker)


def worker_argv() -> list[str]:
    """The worker's command line."""
    return [
        sys.executable,
        "-m",
        "dramatiq",
        f"{__name__}:setup",
        "--processes",
        str(PROCESSES),
        "--threads",
        str(THREADS),
        "--queues",
        names.DRAMATIQ_QUEUE,
    ]


def describe() -> tuple[str, str, str]:
    """Label, worker and client as scenario 11 states them."""
    return (
        f"Dramatiq {metadata.version('dramatiq')}",
        (
            f"`dramatiq --processes {PROCESSES} --threads {THREADS}` (its defaults on 2 cores); "
            "RedisBroker, Results middleware (RedisBackend, store_results), default "
            "middleware, JSON"
        ),
        "`actor.send()`; a window of N in one thread; `message.get_result(block=True)`",
    )


class Client:
    """The benchmark's Dramatiq client: its own broker, the same actor, blocking waits."""

    def __init__(self, url: str) -> None:
        self._broker, self._backend, self._actor = _create(url)

    def send(self) -> Message[Any]:
        """Enqueue one call of the no-op."""
        return self._actor.send()

    def wait(self, message: Message[Any], timeout: float) -> object:
        """Block until ``message``'s result is stored, at most ``timeout`` seconds."""
        result: object = message.get_result(
            backend=self._backend, block=True, timeout=int(timeout * 1000)
        )
        return result

    def close(self) -> None:
        """Close the broker's and the backend's connections."""
        self._broker.close()
        self._backend.client.close()
