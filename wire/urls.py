"""Which kind of server a URL names: the one table of URL schemes, for every side.

The broker (``TOOLEXEC_BROKER_URL``) is a Redis server or RabbitMQ; the store
(``TOOLEXEC_REDIS_URL``: the catalog, replies, claims, outcomes) is always Redis. The
client writes to a Redis broker itself and to RabbitMQ through kombu; a worker reads
either through kombu. Nothing here imports a broker's client library.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = [
    "AMQP_SCHEMES",
    "BROKER_SCHEMES",
    "REDIS_SCHEMES",
    "is_amqp_url",
    "SENTINEL_SCHEME",
    "is_redis_url",
    "is_sentinel_url",
    "is_tls_redis_url",
    "without_password",
]

#: A Redis group's Sentinels, in kombu's form: ``sentinel://h1:26379;sentinel://h2:26379/0``
#: (``wire.connect``), with the group's name in ``TOOLEXEC_SENTINEL_MASTER``.
SENTINEL_SCHEME = "sentinel://"
#: URLs of a Redis server: plain, TLS, a Unix socket, or the master its Sentinels name.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", SENTINEL_SCHEME)
#: URLs of a RabbitMQ broker (kombu's py-amqp transport).
AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
#: Every broker URL a worker accepts: Redis, RabbitMQ, and kombu's in-memory broker
#: (for in-process tests; a client cannot publish to it).
BROKER_SCHEMES = (*REDIS_SCHEMES, *AMQP_SCHEMES, "memory://")


def is_redis_url(url: object) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://``, ``unix://``), or
    the master of a group its Sentinels know (``sentinel://``)."""
    return isinstance(url, str) and url.startswith(REDIS_SCHEMES)


def is_sentinel_url(url: object) -> bool:
    """Whether ``url`` names a Redis group by its Sentinels (``sentinel://``)."""
    return isinstance(url, str) and url.startswith(SENTINEL_SCHEME)


def is_tls_redis_url(url: object) -> bool:
    """Whether ``url`` names a Redis server over TLS (``rediss://``)."""
    return isinstance(url, str) and url.startswith("rediss://")


def is_amqp_url(url: object) -> bool:
    """Whether ``url`` names a RabbitMQ broker (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return isinstance(url, str) and url.startswith(AMQP_SCHEMES)


def without_password(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for reprs and messages); each part of
    a Sentinel URL (``sentinel://...;sentinel://...``) alike."""
    if ";" in url:
        return ";".join(without_password(part) for part in url.split(";"))
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
    except ValueError:
        return "<a URL that does not parse>"
