"""Deliver an outcome to the client waiting for it.

The reply path is a Redis list per client process (``toolexec:reply:<client id>``):
the worker pushes the outcome's JSON and refreshes the list's TTL in one round trip;
the client's single listener pops it. A list, unlike pub/sub, keeps a reply while the
client reconnects.
"""

from __future__ import annotations

import os
import threading

import redis

from executor import keys
from executor.protocol import CallRequest
from executor.settings import Settings

__all__ = ["deliver", "redis_client"]

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


def deliver(client: redis.Redis, request: CallRequest, encoded: str, *, settings: Settings) -> None:
    """Push the encoded outcome of ``request`` to its caller's reply list."""
    if not request.reply_to:
        return
    key = keys.reply(request.reply_to)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(key, encoded)
    pipe.expire(key, settings.reply_ttl)
    pipe.execute()
