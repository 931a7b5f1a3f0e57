"""Which kind of server a URL names: the one table of URL schemes, for every side.

The broker (``TOOLEXEC_BROKER_URL``) is a Redis server or RabbitMQ; the store
(``TOOLEXEC_REDIS_URL``: the catalog, replies, claims, outcomes) is always Redis. The
client writes to a Redis broker itself and to RabbitMQ through kombu; a worker reads
either through kombu. Nothing here imports a broker's client library.
"""

from __future__ import annotations

__all__ = [
    "AMQP_SCHEMES",
    "BROKER_SCHEMES",
    "REDIS_SCHEMES",
    "is_amqp_url",
    "is_redis_url",
    "is_tls_redis_url",
]

#: URLs of a Redis server: plain, TLS, or a Unix socket.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
#: URLs of a RabbitMQ broker (kombu's py-amqp transport).
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
#: Every broker URL a worker accepts: Redis, RabbitMQ, and kombu's in-memory broker
#: (for in-process tests; a client cannot publish to it).
BROKER_SCHEMES = (*REDIS_SCHEMES, *AMQP_SCHEMES, "memory://")


def is_redis_url(url: object) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://``, ``unix://``)."""
    return isinstance(url, str) and url.startswith(REDIS_SCHEMES)


def is_tls_redis_url(url: object) -> bool:
    """Whether ``url`` names a Redis server over TLS (``rediss://``)."""
    return isinstance(url, str) and url.startswith("rediss://")


def is_amqp_url(url: object) -> bool:
    """Whether ``url`` names a RabbitMQ broker (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return isinstance(url, str) and url.startswith(AMQP_SCHEMES)
