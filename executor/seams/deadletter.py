"""Messages a worker refuses: kept in a capped dead-letter list, counted, never logged.

A worker refuses what it cannot run, instead of crashing on it or running it: an item
that is not JSON, JSON that is not kombu's envelope, a message that is not a Celery
protocol-2 task, a task toolexec does not serve, a body it may not decode (pickle), a
call whose fields do not fit :class:`~wire.models.CallRequest`, and an at-least-once
call whose worker process died ``TOOLEXEC_MAX_DELIVERIES`` times. Each refusal

* pushes one JSON entry onto :data:`wire.keys.DEADLETTER` (newest first, capped at
  ``DEADLETTER_MAX_ENTRIES`` with ``LTRIM``, TTL ``DEADLETTER_TTL`` refreshed each time):
  ``reason``, ``queue``, ``time``, ``sha256`` and ``size`` of the payload, ``detail``
  (toolexec's own words, or an exception's type and where it was raised, never its
  message), ``call_id`` when one is known, and the payload itself;
* increments its reason in the hash :data:`wire.keys.DEADLETTER_COUNT`;
* logs one WARNING naming the reason, queue, size and hash: never the payload.

The payload is kept in the entry, base64-encoded and cut at
``DEADLETTER_PAYLOAD_BYTES`` (``payload_truncated`` says so): an operator needs it to see
what was sent, and to push a call again by hand. It is data in Redis, where the message
itself was, and it is never written to a log.
"""

from __future__ import annotations

import enum
import logging
import traceback
from pathlib import PurePath
from typing import Any

import redis

from wire.deadletter import deadletter_commands, deadletter_entry

__all__ = ["Refusal", "dead_letter", "describe", "refuse_message"]

logger = logging.getLogger(__name__)


class Refusal(str, enum.Enum):
    """Why a worker refused a message; the field names of the dead-letter counts."""

    #: The item is larger than any call a client can send.
    TOO_LARGE = "too_large"
    #: The item is not UTF-8 JSON.
    NOT_JSON = "not_json"
    #: JSON, but not kombu's Redis envelope (properties, delivery tag, body encoding).
    NOT_AN_ENVELOPE = "not_an_envelope"
    #: No Celery protocol-2 task header (protocol 1, or no task at all).
    NOT_A_TASK = "not_a_task"
    #: The body cannot be decoded as its headers say (content encoding, compression).
    UNDECODABLE = "undecodable"
    #: A serializer the worker does not accept, such as pickle.
    CONTENT_DISALLOWED = "content_disallowed"
    #: A task name this worker does not serve.
    UNKNOWN_TASK = "unknown_task"
    #: A task message Celery itself calls invalid (a header it cannot read).
    INVALID_TASK = "invalid_task"
    #: A toolexec task whose body or fields are not a toolexec call.
    INVALID_CALL = "invalid_call"
    #: Anything else that failed while the worker's main process took the message.
    UNHANDLED = "unhandled"
    #: An at-least-once call whose worker process died on every delivery.
    WORKER_LOST = "worker_lost"
    #: A call without the signature the worker's ``TOOLEXEC_SIGNING_KEY`` requires.
    UNSIGNED = "unsigned"
    #: A call whose signature does not match it: altered, or signed with another key.
    SIGNATURE_MISMATCH = "signature_mismatch"


def describe(exc: BaseException) -> str:
    """An exception's type and where it was raised, without its message.

    An exception's message may quote the payload (``KeyError('...')``, a JSON error's
    excerpt), so only this goes into a log or a dead-letter entry.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    where = "/".join(PurePath(last.filename).parts[-3:])
    return f"{type(exc).__name__} at {where}:{last.lineno}"


def dead_letter(
    client: redis.Redis,
    reason: Refusal,
    *,
    queue: str,
    payload: bytes | str | None,
    detail: str = "",
    call_id: str | None = None,
) -> bool:
    """Record a refused message in the dead-letter list and count it; never raises.

    Returns whether Redis took the entry.
    """
    entry = deadletter_entry(
        reason.value, queue=queue, payload=payload, detail=detail, call_id=call_id
    )
    digest, size = entry["sha256"], entry["size"]
    logger.warning(
        "refused a message on queue %r: %s%s (%d bytes, sha256 %s); dead-lettered",
        queue,
        reason.value,
        f" ({detail})" if detail else "",
        size,
        digest[:16],
    )
    try:
        pipe = client.pipeline(transaction=False)
        for command in deadletter_commands(entry):
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        pipe.execute()
    except redis.RedisError as exc:
        logger.error(
            "could not dead-letter a refused message (sha256 %s): %s",
            digest[:16],
            type(exc).__name__,
        )
        return False
    return True


def refuse_message(
    message: Any, reason: Refusal, detail: str, *, client: redis.Redis, call_id: str | None = None
) -> bool:
    """Dead-letter a kombu ``message``: the item popped from its queue, when known.

    Returns whether Redis took the entry.
    """
    origin = getattr(message, "toolexec_origin", None)
    if origin is not None:
        queue, payload = origin
    else:  # another transport (kombu's memory transport in tests): the message's own body
        info = getattr(message, "delivery_info", None)
        routing_key = info.get("routing_key") if isinstance(info, dict) else None
        queue = routing_key if isinstance(routing_key, str) else ""
        body = getattr(message, "body", None)
        payload = body if isinstance(body, bytes | str) else b""
    return dead_letter(client, reason, queue=queue, payload=payload, detail=detail, call_id=call_id)
