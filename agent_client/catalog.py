"""Read the tool catalog and which workers are alive.

The view is cached for a fraction of the heartbeat interval, so a call costs no extra
round trip while a dead worker's tools still disappear within about one interval.
"""

from __future__ import annotations

import threading
import time

import pydantic
import redis

from agent_client.errors import BrokerUnavailable, ToolNotFound
from executor import keys
from executor.protocol import ToolSpec, WorkerInfo

__all__ = ["Catalog"]


class Catalog:
    """A cached view of the specs in the catalog and the live workers serving them."""

    def __init__(self, client: redis.Redis, *, max_age: float) -> None:
        self._client = client
        self._max_age = max_age
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._specs: dict[str, ToolSpec] = {}
        self._served: dict[str, frozenset[str]] = {}

    def spec(self, name: str) -> ToolSpec:
        """The spec of a tool that some live worker serves.

        Raises:
            ToolNotFound: No live worker serves ``name``; the message lists what exists.
            BrokerUnavailable: Redis cannot be reached.
        """
        self._refresh_if_stale()
        spec = self._specs.get(name)
        if spec is None or spec.queue not in self._served.get(name, frozenset()):
            self._refresh_if_stale(force=True)
            spec = self._specs.get(name)
        if spec is None:
            raise ToolNotFound(name, self.available(), reason="no worker has published it")
        if spec.queue not in self._served.get(name, frozenset()):
            raise ToolNotFound(name, self.available(), reason=f"no live worker serves it on queue {spec.queue!r}")
        return spec

    def specs(self, queues: frozenset[str] | None = None) -> list[ToolSpec]:
        """Specs of every tool a live worker serves, by name, optionally only on ``queues``."""
        self._refresh_if_stale()
        return [
            spec
            for name, spec in sorted(self._specs.items())
            if spec.queue in self._served.get(name, frozenset()) and (queues is None or spec.queue in queues)
        ]

    def available(self) -> list[str]:
        """Names of the tools a live worker serves."""
        return [spec.name for spec in self.specs()]

    def invalidate(self) -> None:
        """Forget the cached view; the next look-up reads Redis."""
        self._read_at = -float("inf")

    def _refresh_if_stale(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < self._max_age:
            return
        with self._lock:
            if not force and now - self._read_at < self._max_age:
                return
            try:
                self._read()
            except redis.RedisError as exc:
                raise BrokerUnavailable(f"cannot read the tool catalog from Redis: {exc}") from exc
            self._read_at = time.monotonic()

    def _read(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(keys.CATALOG)
        pipe.smembers(keys.WORKERS)
        raw_specs, worker_ids = pipe.execute()
        ids = sorted(w.decode() if isinstance(w, bytes) else w for w in worker_ids)
        beats = self._client.mget([keys.worker(w) for w in ids]) if ids else []
        dead = [w for w, beat in zip(ids, beats, strict=True) if beat is None]
        if dead:
            self._client.srem(keys.WORKERS, *dead)
        served: dict[str, set[str]] = {}
        for beat in beats:
            if beat is None:
                continue
            try:
                info = WorkerInfo.model_validate_json(beat)
            except pydantic.ValidationError:
                continue
            for tool in info.tools:
                served.setdefault(tool, set()).update(info.queues)
        specs: dict[str, ToolSpec] = {}
        for raw in raw_specs.values():
            try:
                spec = ToolSpec.model_validate_json(raw)
            except pydantic.ValidationError:
                continue
            specs[spec.name] = spec
        self._specs = specs
        self._served = {name: frozenset(queues) for name, queues in served.items()}
