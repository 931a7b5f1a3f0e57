"""Publish this worker's tools to the catalog and keep its heartbeat.

On start a worker writes the :class:`ToolSpec` of every registered tool to the catalog
hash and starts a heartbeat: a key per worker, naming the queues and tools it serves,
whose TTL is one heartbeat interval. It is refreshed three times per interval, so a
dead worker drops out within one interval; clients never see it again. Each beat also
writes the specs again, so a catalog lost with a Redis restart heals within a beat, and
records which process holds each call it has taken (``running:<call id>``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import redis

from executor.registry import ToolDefinition
from executor.stats import flush_into
from wire import keys
from wire.clock import refresh_shared_clock, shared_now
from wire.formats import parse_holder_tag
from wire.models import WorkerInfo

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)


class Heartbeat:
    """A daemon thread that keeps this worker's entry in the catalog alive."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        worker_id: str,
        hostname: str,
        queues: Iterable[str],
        definitions: Iterable[ToolDefinition],
        interval: float,
        pool: str = "",
        running: Callable[[], Iterable[tuple[str, str]]] = tuple,
        concurrency: int = 0,
    ) -> None:
        queues = tuple(sorted(set(queues)))
        definitions = list(definitions)
        served = tuple(sorted(d.name for d in definitions if d.spec.queue in queues))
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
        self._specs = {d.name: d.spec.model_dump_json() for d in definitions}
        self._interval = interval
        self._running = running
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolexec-heartbeat", daemon=True)

    def start(self) -> None:
        """Publish the first beat now, then keep beating in the background."""
        self.beat()
        self._thread.start()
        logger.info(
            "toolexec worker %s serves %d tools on queues %s",
            self.info.worker_id, len(self.info.tools), ",".join(self.info.queues),
        )
        # Celery logs its own "ready" at INFO, below its default level (WARNING): say it
        # on stdout, as Celery prints its banner, whatever the level.
        if sys.__stdout__ is not None:
            print(
                f"toolexec worker {self.info.worker_id} ready: queues {','.join(self.info.queues)}; "
                f"tools {', '.join(self.info.tools) or '(none)'}",
                file=sys.__stdout__, flush=True,
            )  # fmt: skip

    def beat(self) -> None:
        """Refresh this worker's heartbeat key once."""
        pipe = self._client.pipeline(transaction=False)
        if self._specs:
            pipe.hset(keys.CATALOG, mapping=cast(Any, self._specs))
        held = list(self._running())
        # A call waiting for a free pool process is held with pid 0 (executor.celery_app).
        running = sum(1 for _, holder in held if parse_holder_tag(holder)[1])
        info = self.info.model_copy(update={"running": running, "beat_at": shared_now()})
        pipe.set(keys.worker(self.info.worker_id), info.model_dump_json(), px=int(self._interval * 1000))
        pipe.sadd(keys.WORKERS, self.info.worker_id)
        # Who holds each call this worker has taken: a client whose call waits that
        # long reads it to notice that this worker died.
        marker_ms = int(self._interval * keys.HELD_MARKER_BEATS * 1000)
        for running_key, holder in held:
            pipe.set(running_key, holder, px=marker_ms)
        # This process's call counts ride on the beat (executor.stats).
        flush_into(pipe)
        pipe.execute()
        # Deadlines use Redis' clock: measure its offset (once a minute) for this process
        # and its pool children (wire.clock), before the first call and off the call path.
        refresh_shared_clock(self._client)

    def stop(self) -> None:
        """Stop beating and leave the catalog at once."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval)
        try:
            pipe = self._client.pipeline(transaction=False)
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
