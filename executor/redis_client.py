"""The worker's Redis client, one per process.

Outcomes travel on a Redis list per client process (``toolexec:reply:<client id>``),
written by :mod:`executor.idempotency`'s ``complete``; the client's single listener
pops them. A list, unlike pub/sub, keeps a reply while the client reconnects.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import redis

from wire.settings import Settings

__all__ = ["FIRST_PAUSE", "redis_client", "redis_client_for_url", "retry_pauses"]

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def redis_client(settings: Settings) -> redis.Redis:
    """This process's Redis client for ``settings.redis_url`` (made again after a fork)."""
    return redis_client_for_url(settings.redis_url)


def redis_client_for_url(url: str) -> redis.Redis:
    """This process's Redis client for ``url`` (made again after a fork)."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(
                    url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30,
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
