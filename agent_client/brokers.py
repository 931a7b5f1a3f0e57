"""Which kind of broker a URL names, without importing any broker's client library.

A Redis broker is written to by the client itself (:mod:`agent_client.send`); a
RabbitMQ broker through kombu (:mod:`agent_client.amqp`), imported only by the
clients that use one.
"""

from __future__ import annotations

__all__ = ["AMQP_SCHEMES", "REDIS_SCHEMES", "is_amqp_url", "is_redis_url"]

#: Broker URLs of Redis.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: Broker URLs of RabbitMQ (kombu's py-amqp transport).
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://``, ``unix://``)."""
    return url.startswith(REDIS_SCHEMES)


def is_amqp_url(url: str) -> bool:
    """Whether ``url`` names a RabbitMQ broker (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return url.startswith(AMQP_SCHEMES)
