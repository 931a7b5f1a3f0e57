"""Calls written straight onto a queue, and their replies read straight from Redis.

For tests that play a message's redelivery (the same envelope pushed again) or read
what a worker answered each delivery, below the client.
"""

from __future__ import annotations

import time
from typing import cast

import redis

from wire import keys
from wire.message import redis_envelope, task_headers
from wire.models import TASK_AT_LEAST_ONCE, CallOutcome, CallRequest

__all__ = ["push_call", "read_replies"]


def push_call(
    client: redis.Redis,
    call: CallRequest,
    *,
    queue: str,
    times: int = 1,
    task_name: str = TASK_AT_LEAST_ONCE,
) -> None:
    """Push the message of ``call`` onto ``queue`` ``times`` times, as the client writes it."""
    envelope = redis_envelope(call, queue=queue, headers=task_headers(call, task_name=task_name))
    for _ in range(times):
        client.lpush(queue, envelope)


def read_replies(
    client: redis.Redis, reply_to: str, n: int, timeout: float = 15.0
) -> list[CallOutcome]:
    """Up to ``n`` outcomes pushed to the reply list of ``reply_to`` within ``timeout``."""
    out: list[CallOutcome] = []
    ends = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < ends:
        item = client.blpop([keys.reply(reply_to)], timeout=1)
        if item is not None:
            frame = cast(bytes, item[1])
            out.append(CallOutcome.model_validate_json(frame.partition(b"\n")[2]))
    return out
