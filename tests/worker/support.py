"""Helpers shared by the worker-side tests: fresh names, calls, replies, bounded waits."""

from __future__ import annotations

import uuid
from typing import Any

import redis

from tests.integration.polling import wait_until
from wire import keys
from wire.formats import parse_frame
from wire.models import CallOutcome, CallRequest

__all__ = ["make_call", "next_reply", "no_reply", "unique", "wait_until"]


def unique(prefix: str) -> str:
    """A name no other test uses: ``<prefix>-<12 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def make_call(tool: str, /, **fields: Any) -> CallRequest:
    """A call of ``tool`` with a fresh call id and reply address; ``fields`` override."""
    values: dict[str, Any] = {"call_id": unique("call"), "tool": tool, "reply_to": unique("client")}
    values.update(fields)
    return CallRequest(**values)


def next_reply(client: redis.Redis, reply_to: str, timeout: float = 5.0) -> tuple[str, CallOutcome]:
    """Pop the next reply frame for ``reply_to`` (blocking up to ``timeout``): (call id,
    outcome)."""
    popped = client.blpop([keys.reply(reply_to)], timeout=timeout)
    assert popped is not None, f"no reply for {reply_to} within {timeout}s"
    frame = popped[1]
    assert isinstance(frame, bytes)
    call_id, is_progress, body = parse_frame(frame)
    assert not is_progress, f"a progress frame of {call_id} where an outcome was expected"
    return call_id, CallOutcome.model_validate_json(body)


def no_reply(client: redis.Redis, reply_to: str) -> bool:
    """Whether nothing is (left) on ``reply_to``'s reply list."""
    return client.llen(keys.reply(reply_to)) == 0
