"""On RabbitMQ, an at-most-once call is recorded as held before it is acknowledged.

RabbitMQ forgets a message once its consumer acknowledges it, and it puts back by itself
every message a consumer that went away had not acknowledged. An at-most-once call is
acknowledged when its pool process takes it (Celery's ``Request.on_accepted``), before
its tool runs; its worker's heartbeat names it a third of an interval later at most. A
worker that died in between took the call with it and left no trace, and the caller's
watchdog (:mod:`agent_client.amqp_watch`), which cannot search RabbitMQ for a message,
waited until the deadline, or forever without one. So, with an ``amqp://`` broker, the
holder of an at-most-once call (``running:<call id>``, pid and all) is written

1. by the worker's request, before it acknowledges the call (:func:`hold`): an
   acknowledged call is always recorded; and
2. by a prefork pool child, before the tool starts (:func:`hold`, from
   :func:`executor.task.admit`): the child is told to run the call before the main
   process acknowledges it, so a started call is always recorded too. On the solo,
   threads and asyncio pools the request's write comes before the tool in any case.

A dead worker's record with a pid therefore means the call was acknowledged or started:
the watchdog reports ``WorkerLost``. A worker that died after writing it but before its
acknowledgement reached RabbitMQ leaves the message to be delivered again; the worker
that receives that copy finds the record (:func:`started_before`) and refuses it
(dead-lettered, ``worker_lost``) instead of running the call a second time.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from wire import keys
from wire.formats import parse_holder_tag
from wire.settings import Settings

__all__ = ["AMQP_SCHEMES", "holds_before_ack", "hold", "started_before", "waits_for_hold"]

logger = logging.getLogger(__name__)

#: Broker URLs of RabbitMQ (kombu's py-amqp transport).
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")


def holds_before_ack(settings: Settings, *, acks_late: bool) -> bool:
    """Whether a call of a task that ``acks_late`` or not is recorded before it is acknowledged."""
    return not acks_late and settings.broker_url.startswith(AMQP_SCHEMES)


def hold(client: redis.Redis, call_id: str, tag: str, *, interval: float) -> bool:
    """Record ``tag`` as the holder of call ``call_id``, as the heartbeat would; whether it was.

    Never raises: a Redis that cannot be reached leaves the call to its heartbeat.
    """
    try:
        client.set(keys.running(call_id), tag, px=int(interval * keys.HELD_MARKER_BEATS * 1000))
    except redis.RedisError as exc:
        logger.warning("could not record the holder of call %s: %s", call_id, type(exc).__name__)
        return False
    return True


def started_before(client: redis.Redis, call_id: str) -> bool:
    """Whether a process was recorded as running call ``call_id`` (a holder with a pid).

    A record without a pid (the heartbeat's, for a call waiting for a pool process) does
    not count. Redis unreachable: False (the call runs, as it would without this look).
    """
    try:
        record = client.get(keys.running(call_id))
    except redis.RedisError as exc:
        logger.warning("could not read the holder of call %s: %s", call_id, type(exc).__name__)
        return False
    return record is not None and parse_holder_tag(record)[1] != 0


def waits_for_hold(accept_callback: Any) -> bool:
    """Whether a pool's ``accept_callback`` writes to Redis before acknowledging (off an event loop)."""
    return (
        getattr(getattr(accept_callback, "__self__", None), "toolexec_holds_before_ack", False)
        is True
    )
