"""What ``toolexec tools`` and ``toolexec status`` read: the live state of a deployment.

Everything comes from Redis, read-only, in a few pipelined round trips:

* the live workers: the heartbeats (:class:`~wire.models.WorkerInfo` under
  :func:`wire.keys.worker`) of the ids in :data:`wire.keys.WORKERS`; a worker whose
  heartbeat expired is gone;
* the live catalog: each spec in :data:`wire.keys.CATALOG` that a live worker serves;
* the depth of each queue, from the broker: with Redis, ``LLEN`` of the queue's list
  (and of kombu's lists for its priorities, which toolexec's calls do not use but
  other senders may); with RabbitMQ, the message count of a passive ``queue.declare``
  (a queue not declared yet holds nothing);
* calls per tool over the last minute and hour (:mod:`executor.stats`);
* the dead-letter count (:data:`wire.keys.DEADLETTER_COUNT`, per refusal reason).

Times are Redis' clock (``TIME``), the clock workers stamp their beats with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pydantic
import redis
from redis.connection import parse_url

from executor.stats import read_counts
from wire import keys
from wire.connect import sync_client
from wire.models import ToolSpec, WorkerInfo
from wire.settings import Settings
from wire.urls import is_redis_url, is_sentinel_url

__all__ = [
    "BrokerUnreachable",
    "Live",
    "amqp_queue_depths",
    "broker_client",
    "queue_depths",
    "queues_in_store",
    "read_live",
    "status_snapshot",
    "tool_rows",
    "worker_row",
]

#: kombu's Redis transport: a queue's list for priority ``p`` is ``<queue>\x06\x16<p>``.
_PRIORITY_SEPARATOR = "\x06\x16"
_PRIORITY_STEPS = (3, 6, 9)


class BrokerUnreachable(Exception):
    """The broker the queues are in (RabbitMQ, or a Redis apart from the catalog's) cannot be read.

    The message names that broker, never the catalog's Redis.
    """


@dataclass(frozen=True, slots=True)
class Live:
    """The live workers and the catalog, read at ``now`` (epoch seconds, Redis' clock)."""

    now: float
    workers: tuple[WorkerInfo, ...]
    specs: dict[str, ToolSpec]

    def serving(self, spec: ToolSpec) -> list[WorkerInfo]:
        """The live workers that serve ``spec`` on its queue."""
        return [w for w in self.workers if spec.name in w.tools and spec.queue in w.queues]

    def live_specs(self) -> list[ToolSpec]:
        """The specs some live worker serves, by name."""
        return [spec for _, spec in sorted(self.specs.items()) if self.serving(spec)]

    def missing_tools(self) -> list[tuple[WorkerInfo, str, tuple[str, ...]]]:
        """(worker, queue, tools): a live worker consuming ``queue`` that lacks ``tools``
        other live workers serve on it; a call for one of them that worker takes fails
        with ``ToolNotFound``. Sorted by worker and queue."""
        served: dict[str, set[str]] = {}
        for spec in self.live_specs():
            served.setdefault(spec.queue, set()).add(spec.name)
        found = []
        for worker in self.workers:
            for queue in worker.queues:
                missing = served.get(queue, set()) - set(worker.tools)
                if missing:
                    found.append((worker, queue, tuple(sorted(missing))))
        return sorted(found, key=lambda item: (item[0].worker_id, item[1]))


def read_live(client: redis.Redis) -> Live:
    """Read the live workers and the catalog (two round trips).

    Raises:
        redis.RedisError: Redis cannot be reached.
    """
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.smembers(keys.WORKERS)
    pipe.hgetall(keys.CATALOG)
    (seconds, micros), ids, raw_specs = pipe.execute()
    worker_ids = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in ids)
    beats = client.mget([keys.worker(i) for i in worker_ids]) if worker_ids else []
    workers = []
    for beat in beats:
        if beat is None:
            continue
        try:
            workers.append(WorkerInfo.model_validate_json(beat))
        except pydantic.ValidationError:
            continue
    specs = {}
    for raw in raw_specs.values():
        try:
            spec = ToolSpec.model_validate_json(raw)
        except pydantic.ValidationError:
            continue
        specs[spec.name] = spec
    workers.sort(key=lambda w: w.worker_id)
    return Live(now=int(seconds) + int(micros) / 1e6, workers=tuple(workers), specs=specs)


def tool_rows(live: Live, settings: Settings) -> list[dict[str, Any]]:
    """One JSON-ready row per tool a live worker serves, by name (``toolexec tools``).

    ``timeout`` is the deadline a call gets when the caller sets none: the tool's own
    (``timeout_from: "tool"``), else the settings' default (``"settings"``); null means
    no deadline.
    """
    rows = []
    for spec in live.live_specs():
        timeout = spec.timeout if spec.timeout is not None else settings.default_timeout
        rows.append(
            {
                "name": spec.name,
                "queue": spec.queue,
                "idempotent": spec.idempotent,
                "timeout": timeout,
                "timeout_from": "tool" if spec.timeout is not None else "settings",
                "hard_timeout": spec.hard_timeout,
                "delivery": spec.delivery,
                "retries": spec.retries,
                "requires_approval": spec.requires_approval,
                "on_abandon": spec.on_abandon,
                "description": spec.description.strip().splitlines()[0]
                if spec.description.strip()
                else "",
                "workers": [w.worker_id for w in live.serving(spec)],
            }
        )
    return rows


def worker_row(info: WorkerInfo, now: float) -> dict[str, Any]:
    """One JSON-ready row per live worker (``toolexec status``)."""
    return {
        "worker_id": info.worker_id,
        "hostname": info.hostname,
        "pid": info.pid,
        "queues": list(info.queues),
        "tools": list(info.tools),
        "pool": info.pool,
        "concurrency": info.concurrency,
        "running": info.running,
        "ignoring_cancel": info.ignoring_cancel,
        "started_at": info.started_at,
        "last_heartbeat": info.beat_at or None,
        "heartbeat_age": round(max(0.0, now - info.beat_at), 3) if info.beat_at else None,
    }


def queue_depths(client: redis.Redis, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue (its list and its priority lists), one round trip."""
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
        for step in _PRIORITY_STEPS:
            pipe.llen(f"{queue}{_PRIORITY_SEPARATOR}{step}")
    lengths = iter(pipe.execute())
    per_queue = 1 + len(_PRIORITY_STEPS)
    return {queue: sum(int(next(lengths)) for _ in range(per_queue)) for queue in queues}


def amqp_queue_depths(url: str, queues: list[str], *, timeout: float = 5.0) -> dict[str, int]:
    """Messages ready in each RabbitMQ queue (passive ``queue.declare``); 0 for one not declared.

    Raises:
        BrokerUnreachable: RabbitMQ cannot be reached or refused the connection.
    """
    from amqp.exceptions import AMQPError, NotFound  # type: ignore[import-untyped]  # kombu's AMQP client
    from kombu.connection import Connection
    from kombu.exceptions import KombuError

    depths: dict[str, int] = {}
    try:
        with Connection(url, connect_timeout=timeout) as connection:  # type: ignore[no-untyped-call]
            channel = connection.channel()
            for queue in queues:
                try:
                    _, count, _ = channel.queue_declare(queue=queue, passive=True)
                except NotFound:  # RabbitMQ closes the channel: open another
                    count = 0
                    channel = connection.channel()
                depths[queue] = int(count)
    except (OSError, KombuError, AMQPError) as exc:
        raise BrokerUnreachable(f"RabbitMQ at {_location(url)} is unreachable: {exc}") from exc
    return depths


def _matches(info: WorkerInfo, name: str) -> bool:
    # A node name ("celery@web-1"), its host part ("web-1"), or the worker id.
    return name in (info.hostname, info.hostname.partition("@")[2], info.worker_id)


def status_snapshot(
    client: redis.Redis,
    *,
    worker: str | None = None,
    broker_url: str | None = None,
    sentinel_master: str | None = None,
    redis_url: str | None = None,
    broker: redis.Redis | None = None,
) -> dict[str, Any]:
    """Everything ``toolexec status`` shows, as JSON-ready data.

    Keys: ``time`` (Redis' clock), ``worker_filter`` (``worker``: the name the workers
    were filtered by, or null), ``workers`` (a list of :func:`worker_row`), ``queues``
    (queue -> depth: every queue a live worker consumes or a tool names, and
    ``default``), ``calls`` (``last_minute`` and ``last_hour``: tool -> ``done``,
    ``failed``, ``timed_out``, ``by_kind`` and ``retries``, the attempts that retried a
    call), ``deadletter`` (``count``: messages
    refused in all, ``by_reason``; ``kept``: entries in the list). When the queues'
    broker (RabbitMQ, or another Redis) cannot be read, ``queues`` is empty and
    ``broker_error`` says which broker and why; the rest is read all the same.

    A call counts as ``timed_out`` when the worker ended it for its deadline: shed
    because it expired before it started, or stopped at its hard limit. A call whose
    caller stopped waiting at its deadline while the tool ran on, and which then
    finished, counts as ``done`` or ``failed``, as it ended: the worker cannot know that
    its caller left (the caller hears ``ToolTimeoutError``; ``toolexec call`` exits 3).

    Args:
        client: Redis of the catalog (``settings.redis_url``).
        worker: Only the workers of this node name, host name or worker id.
        broker_url: Where the queues are (``settings.broker_url``), when not in ``client``:
            another Redis, or RabbitMQ (``amqp://``).
        sentinel_master: The group a ``sentinel://`` broker URL names.
        redis_url: ``client``'s URL (``settings.redis_url``): a broker URL that is the
            same is read through ``client`` (a Sentinel group's master among them).
        broker: A client of the broker's Redis, when it is another: kept by a caller that
            takes many snapshots (``status --watch``); made for this one when omitted.

    Raises:
        redis.RedisError: Redis cannot be reached.
    """
    live = read_live(client)
    workers = [w for w in live.workers if worker is None or _matches(w, worker)]
    queues = sorted(
        {"default"}
        | {q for w in live.workers for q in w.queues}
        | {s.queue for s in live.specs.values()}
    )
    broker_error = None
    try:
        depths = _depths(client, queues, broker_url, sentinel_master, redis_url, broker)
    except BrokerUnreachable as exc:
        depths, broker_error = {}, str(exc)
    counts = read_counts(client, live.now)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.DEADLETTER_COUNT)
    pipe.llen(keys.DEADLETTER)
    by_reason_raw, kept = pipe.execute()
    by_reason = {
        (reason.decode() if isinstance(reason, bytes) else str(reason)): int(count)
        for reason, count in by_reason_raw.items()
    }
    return {
        "time": live.now,
        "worker_filter": worker,
        "workers": [worker_row(w, live.now) for w in workers],
        "queues": depths,
        "calls": {
            window: {tool: tool_counts.as_dict() for tool, tool_counts in by_tool.items()}
            for window, by_tool in counts.items()
        },
        "deadletter": {
            "count": sum(by_reason.values()),
            "by_reason": dict(sorted(by_reason.items())),
            "kept": int(kept),
        },
        **({"broker_error": broker_error} if broker_error is not None else {}),
    }


def _depths(
    client: redis.Redis,
    queues: list[str],
    broker_url: str | None,
    sentinel_master: str | None,
    redis_url: str | None,
    broker: redis.Redis | None,
) -> dict[str, int]:
    if broker_url is None or queues_in_store(client, broker_url, redis_url):
        return queue_depths(client, queues)
    if not is_redis_url(broker_url):
        return amqp_queue_depths(broker_url, queues)
    try:
        if broker is not None:
            return queue_depths(broker, queues)
        with broker_client(broker_url, sentinel_master) as made:
            return queue_depths(made, queues)
    except redis.RedisError as exc:
        raise BrokerUnreachable(
            f"the broker's Redis at {_location(broker_url)} is unreachable: {exc}"
        ) from exc


def queues_in_store(client: redis.Redis, broker_url: str, redis_url: str | None) -> bool:
    """Whether the broker's queues are in ``client``'s Redis, the store's: its URL is the
    store's (``redis_url``; a Sentinel group's alike), or names the same server."""
    return broker_url == redis_url or (
        is_redis_url(broker_url) and _same_server(client, broker_url)
    )


def broker_client(broker_url: str, sentinel_master: str | None) -> redis.Redis:
    """A client of the broker's Redis, as ``toolexec status`` reads its queues."""
    return sync_client(
        broker_url, master=sentinel_master, socket_connect_timeout=2.0, socket_timeout=5.0
    )


def _location(url: str) -> str:
    """Where ``url`` points, without its scheme and credentials (``host:port/vhost``)."""
    return url.partition("://")[2].rpartition("@")[2]


def _same_server(client: redis.Redis, url: str) -> bool:
    if is_sentinel_url(url):
        return False  # whichever server is the master now: asked through its Sentinels
    kwargs = client.connection_pool.connection_kwargs
    other: dict[str, object] = parse_url(url)  # type: ignore[no-untyped-call]
    fields = ("host", "port", "path", "db")
    return all(kwargs.get(field) == other.get(field) for field in fields)
