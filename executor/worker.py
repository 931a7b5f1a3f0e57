"""This worker process: who it is, its Redis client, and its heartbeat.

**Who.** A call that starts records a *holder* (:func:`wire.formats.holder_tag`) in
Redis, so a waiting client, or a redelivery, can tell whether the process running it is
alive: :func:`worker_id` names the worker, :func:`holder` one of its processes, and
:func:`pid_alive` tells whether a process of this host still lives.

**Its Redis client**, one per process (:func:`redis_client`). Outcomes travel on a Redis
list per client process (``toolexec:reply:<client id>``), written by
:func:`executor.claims.complete`; the client's single listener pops them. A list,
unlike pub/sub, keeps a reply while the client reconnects.

**The heartbeat** (:class:`Heartbeat`). On start a worker writes the :class:`ToolSpec`
of every registered tool to the catalog hash and starts a heartbeat: a key per worker,
naming the queues and tools it serves, whose TTL is one heartbeat interval. It is
refreshed three times per interval, so a dead worker drops out within one interval;
clients never see it again. Each beat also writes the specs again, so a catalog lost
with a Redis restart heals within a beat, and records which process holds each call it
has taken (``running:<call id>``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import redis

from executor.keeper import Keeper
from wire import keys
from wire.clock import refresh_shared_clock, shared_now
from wire.connect import sync_client
from wire.formats import holder_tag, parse_holder_tag
from wire.models import ToolSpec, WorkerInfo
from wire.settings import Settings

__all__ = [
    # Who this process is
    "holder",
    "in_pool_child",
    "mark_main_process",
    "pid_alive",
    "worker_id",
    # Its Redis client
    "FIRST_PAUSE",
    "redis_client",
    "redis_client_for_url",
    "retry_pauses",
    # Its heartbeat
    "Heartbeat",
]

logger = logging.getLogger(__name__)

# -- who this process is --------------------------------------------------------------

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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- its Redis client -----------------------------------------------------------------

_lock = threading.Lock()
_clients: dict[tuple[int, str, str | None], redis.Redis] = {}


def redis_client(settings: Settings) -> redis.Redis:
    """This process's Redis client for ``settings.redis_url`` (made again after a fork)."""
    return redis_client_for_url(settings.redis_url, master=settings.sentinel_master)


def redis_client_for_url(url: str, *, master: str | None = None) -> redis.Redis:
    """This process's Redis client for ``url`` (made again after a fork); for a
    ``sentinel://`` URL, of the master of the group ``master`` (:mod:`wire.connect`)."""
    key = (os.getpid(), url, master)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = sync_client(
                    url,
                    master=master,
                    socket_timeout=10,
                    socket_connect_timeout=5,
                    health_check_interval=30,
                )
                _clients[key] = client
    return client


#: The first pause of :func:`retry_pauses`.
FIRST_PAUSE = 0.05


def retry_pauses(patience: float) -> Iterator[float]:
    """Pauses between attempts while Redis errs: 50 ms doubling to 1 s, as many as fit
    in ``patience`` seconds from now (each is checked when it is asked for)."""
    give_up = time.monotonic() + patience
    pause = FIRST_PAUSE
    while time.monotonic() + pause < give_up:
        yield pause
        pause = min(pause * 2, 1.0)


# -- its heartbeat --------------------------------------------------------------------


class Heartbeat:
    """A daemon thread that keeps this worker's entry in the catalog alive."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        worker_id: str,
        hostname: str,
        queues: Iterable[str],
        specs: Iterable[ToolSpec],
        interval: float,
        flush_counts: Callable[[Any], object],
        pool: str = "",
        running: Callable[[], Iterable[tuple[str, str]]] = tuple,
        ignoring_cancel: Callable[[], int] = int,
        concurrency: int = 0,
        keeper: Keeper | None = None,
    ) -> None:
        queues = tuple(sorted(set(queues)))
        specs = list(specs)
        served = tuple(sorted(spec.name for spec in specs if spec.queue in queues))
        self.info = WorkerInfo(
            worker_id=worker_id,
            hostname=hostname or socket.gethostname(),
            pid=os.getpid(),
            queues=queues,
            tools=served,
            pool=pool,
            started_at=time.time(),
            concurrency=concurrency,
        )
        self._client = client
        self._specs = {spec.name: spec.model_dump_json() for spec in specs}
        self._interval = interval
        self._flush_counts = flush_counts
        self._running = running
        self._ignoring_cancel = ignoring_cancel
        self._keeper = keeper
        self._out_of_memory = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolexec-heartbeat", daemon=True)

    def start(self) -> None:
        """Publish the first beat now, then keep beating in the background."""
        self.beat()
        if self._keeper is not None:
            self._keeper.start()
        self._thread.start()
        logger.info(
            "toolexec worker %s serves %d tools on queues %s",
            self.info.worker_id,
            len(self.info.tools),
            ",".join(self.info.queues),
        )
        # Celery logs its own "ready" at INFO, below its default level (WARNING): say it
        # on stdout, as Celery prints its banner, whatever the level.
        if sys.__stdout__ is not None:
            print(
                f"toolexec worker {self.info.worker_id} ready: queues "
                f"{','.join(self.info.queues)}; tools {', '.join(self.info.tools) or '(none)'}",
                file=sys.__stdout__,
                flush=True,
            )

    def beat(self) -> None:
        """Refresh this worker's heartbeat key once."""
        # Deadlines use Redis' clock: measure its offset (once a minute) for this process
        # and its pool children (wire.clock), off the call path, and before the first beat
        # publishes this worker and its tools: a client sends calls once it sees them, and
        # a call checked against an unmeasured clock (one that runs ahead) was refused.
        refresh_shared_clock(self._client)
        pipe = self._client.pipeline(transaction=False)
        if self._specs:
            pipe.hset(keys.CATALOG, mapping=cast(Any, self._specs))
        held = list(self._running())
        # A call waiting for a free pool process is held with pid 0 (executor.seams.app).
        running = sum(1 for _, holder in held if parse_holder_tag(holder)[1])
        info = self.info.model_copy(
            update={
                "running": running,
                "beat_at": shared_now(),
                "ignoring_cancel": self._ignoring_cancel(),
            }
        )
        pipe.set(
            keys.worker(self.info.worker_id), info.model_dump_json(), px=int(self._interval * 1000)
        )
        pipe.sadd(keys.WORKERS, self.info.worker_id)
        # Who holds each call this worker has taken: a client whose call waits that
        # long reads it to notice that this worker died.
        marker_ms = int(self._interval * keys.HELD_MARKER_BEATS * 1000)
        for running_key, holder in held:
            pipe.set(running_key, holder, px=marker_ms)
        # This process's call counts ride on the beat (executor.stats.flush_into).
        self._flush_counts(pipe)
        failed = [r for r in pipe.execute(raise_on_error=False) if isinstance(r, Exception)]
        if any(isinstance(r, redis.exceptions.OutOfMemoryError) for r in failed):
            self._keep_alive([running_key for running_key, _ in held], marker_ms)
        elif failed:
            raise failed[0]
        elif self._out_of_memory:
            self._out_of_memory = False
            logger.warning("heartbeat of %s: Redis takes writes again", self.info.worker_id)
        if self._keeper is not None:
            self._keeper.note(held, info.model_dump_json())

    def _keep_alive(self, records: list[str], marker_ms: int) -> None:
        """Redis refuses writes for want of memory: keep this worker's key and its records
        alive with ``PEXPIRE``, which it still takes, so that no waiting client takes
        this live worker for dead. A call taken meanwhile is recorded once Redis has room."""
        if not self._out_of_memory:
            self._out_of_memory = True
            logger.warning(
                "heartbeat of %s: Redis is out of memory (maxmemory) and refuses writes; keeping "
                "this worker's key and its calls' records alive until it takes writes again",
                self.info.worker_id,
            )
        pipe = self._client.pipeline(transaction=False)
        pipe.pexpire(keys.worker(self.info.worker_id), int(self._interval * 1000))
        for record in records:
            pipe.pexpire(record, marker_ms)
        pipe.execute()

    def stop(self, *, warm: bool = False) -> None:
        """Stop beating (and the keeper) and leave the catalog at once; ``warm``: say
        that the worker left nothing behind (:func:`wire.keys.left`), before its
        heartbeat goes."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval)
        if self._keeper is not None:
            self._keeper.stop()
        try:
            pipe = self._client.pipeline(transaction=False)
            if warm:
                life = int(keys.LEFT_BEATS * self._interval * 1000)
                pipe.set(keys.left(self.info.worker_id), "1", px=life)
            pipe.delete(keys.worker(self.info.worker_id))
            pipe.srem(keys.WORKERS, self.info.worker_id)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("could not remove heartbeat of %s: %s", self.info.worker_id, exc)

    def _run(self) -> None:
        while not self._stopping.wait(self._interval / 3):
            try:
                self.beat()
            except redis.RedisError as exc:
                logger.warning("heartbeat of %s failed: %s", self.info.worker_id, exc)
