"""Celery's task message (protocol 2), built and read without Celery.

The client writes the message straight onto the queue's Redis list, exactly as
``app.send_task`` and kombu's Redis transport would (the contract tests in
``tests/contract/`` compare the two field for field on the pinned versions), so a stock
``celery worker`` runs it and Flower and ``celery inspect`` see it, without paying for
``apply_async`` on every call.

A call's arguments are encoded to JSON once (:func:`encode_arguments`); that text is
measured against the size limit and spliced into the message body as it is.
A copy of the message sent again is spelled in :mod:`wire.copies`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic_core import to_json

from wire.clock import shared_now
from wire.models import CallRequest

__all__ = [
    "CELERY_EXPIRY_GRACE",
    "CELERY_LIMIT_MARGIN",
    "ArgumentsNotJSON",
    "encode_arguments",
    "message_body",
    "redis_envelope",
    "task_headers",
]

#: Seconds after the deadline that Celery's own ``expires`` falls. Celery's main process
#: drops an expired message by the worker's local clock, so a worker whose clock runs
#: ahead would drop live calls; the task's own check, on the clock client and workers
#: share (:mod:`wire.clock`), sheds on time. Celery's check only drops stale messages.
CELERY_EXPIRY_GRACE = 60.0

#: Celery's hard limit (the ``timelimit`` header) sits this far above a tool's own, so
#: the tool's limit fires first and Celery's only reclaims a prefork child stuck in a
#: thread that won't stop. Redis' visibility timeout must exceed it (executor, doctor).
CELERY_LIMIT_MARGIN = 1.0

_EMBED = b'{"callbacks":null,"errbacks":null,"chain":null,"chord":null}'


class ArgumentsNotJSON(ValueError):
    """The arguments hold a value JSON cannot carry (NaN, a lone surrogate, an object)."""


def encode_arguments(arguments: dict[str, Any]) -> bytes:
    """The arguments as compact UTF-8 JSON, the one encoding that goes on the wire.

    Raises:
        ArgumentsNotJSON: A value is not JSON: not a JSON type, NaN or Infinity, or a
            string that is not valid Unicode (a lone surrogate).
    """
    try:
        text = json.dumps(arguments, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        return text.encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ArgumentsNotJSON(str(exc)) from exc


def task_headers(
    call: CallRequest,
    *,
    task_name: str,
    hard_limit: float | None = None,
    origin: str = "",
    extra_headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Protocol 2 headers for ``call``; no tool data goes into the reprs.

    ``expires`` is the deadline plus :data:`CELERY_EXPIRY_GRACE`. ``shadow`` is the
    tool's name, so Celery's logs, events and Flower show each call under its tool.
    ``extra_headers`` (for example a W3C ``traceparent``) are added as they are, as
    ``send_task(headers=...)`` adds them; a worker reads each as ``task.request.<name>``.
    """
    expires = (
        datetime.fromtimestamp(call.deadline + CELERY_EXPIRY_GRACE, tz=UTC).isoformat()
        if call.deadline is not None
        else None
    )
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task_name,
        "id": call.call_id,
        "shadow": call.tool,
        "eta": None,
        "expires": expires,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [hard_limit, None],
        "root_id": call.call_id,
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": _kwargsrepr(call.tool),
        "origin": origin,
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    if extra_headers:
        headers.update(extra_headers)
    return headers


def _kwargsrepr(tool: str) -> str:
    return f"{{'tool': {tool!r}}}"


def message_body(call: CallRequest, arguments_json: bytes) -> bytes:
    """The protocol 2 body ``[args, kwargs, embed]``, with the arguments spliced in."""
    head = to_json(call.model_dump(mode="json", exclude={"arguments"}))
    return b"[[]," + head[:-1] + b',"arguments":' + arguments_json + b"}," + _EMBED + b"]"


def redis_envelope(
    call: CallRequest, *, queue: str, headers: dict[str, Any], arguments_json: bytes | None = None
) -> str:
    """The JSON kombu's Redis transport stores in a queue's list for ``call``."""
    if arguments_json is None:
        arguments_json = encode_arguments(call.arguments)
    properties: dict[str, Any] = {
        "correlation_id": call.call_id,
        "reply_to": call.reply_to,
        "kwargsrepr": headers["kwargsrepr"],
        "argsrepr": headers["argsrepr"],
        "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": 0,
        "body_encoding": "base64",
        "delivery_tag": call.call_id,
    }
    if call.deadline is not None:
        # AMQP's per-message TTL (milliseconds, as a string) to ``expires``, as
        # apply_async sets it; relative, so measured on the clock the deadline was set by.
        left = call.deadline + CELERY_EXPIRY_GRACE - shared_now()
        properties["expiration"] = str(max(0, int(left * 1000)))
    return to_json(
        {
            "body": base64.b64encode(message_body(call, arguments_json)).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": properties,
        },
    ).decode()
