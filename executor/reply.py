"""The worker's Redis client, one per process.

Outcomes travel on a Redis list per client process (``toolexec:reply:<client id>``),
written by :mod:`executor.idempotency`'s ``complete``; the client's single listener
pops them. A list, unlike pub/sub, keeps a reply while the client reconnects.
"""

from __future__ import annotations

import os
import threading

import redis

from executor.settings import Settings

__all__ = ["redis_client"]

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(settings: Settings) -> redis.Redis:
    """This process's Redis client for ``settings.redis_url`` (made again after a fork)."""
    key = (os.getpid(), settings.redis_url)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    settings.redis_url, socket_timeout=10, socket_connect_timeout=5,
                    health_check_interval=30,
                )
                _clients[key] = client
    return client
