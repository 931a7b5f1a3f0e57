"""A worker with ``TOOLEXEC_SIGNING_KEY`` runs only calls signed with it.

:func:`check_signature` runs first in the task body (:mod:`executor.task`), before
the call's fields are trusted for anything. A call that is unsigned, or whose signature
does not match it (:mod:`wire.signing`), is refused:

* dead-lettered (:mod:`executor.seams.deadletter`, reason ``unsigned`` or
  ``signature_mismatch``) with the task name and keyword arguments as its payload;
* answered with an error outcome on the reply list its message names, so a client
  whose key is missing or differs learns why at once instead of at its deadline.

The reply address of a refused message is not authenticated: anyone who can write to
the queue could name another client's. What such a message can cause is one error
frame for a call id it names, never a result; and the refusal touches no claim,
waiter list or stored outcome. docs/security.md weighs this.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import redis

from executor.seams.deadletter import Refusal, dead_letter
from executor.worker import redis_client
from wire import keys
from wire.formats import reply_frame
from wire.models import CallOutcome, ErrorKind
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER, SIGNED_HEADERS, SignatureProblem, verify

__all__ = ["check_signature", "refusal_outcome", "signed_headers_of"]

logger = logging.getLogger(__name__)

_DETAIL: dict[SignatureProblem, str] = {
    "unsigned": f"no {SIGNATURE_HEADER} header, and this worker requires one",
    "signature_mismatch": (
        f"{SIGNATURE_HEADER} does not match the message: altered, or signed with another key"
    ),
}
_TYPE: dict[SignatureProblem, str] = {
    "unsigned": "UnsignedCall",
    "signature_mismatch": "SignatureMismatch",
}
_MESSAGE: dict[SignatureProblem, str] = {
    "unsigned": (
        "the worker refused this call: it is not signed, and workers require signed calls "
        "(set TOOLEXEC_SIGNING_KEY on the client to the workers' key)"
    ),
    "signature_mismatch": (
        "the worker refused this call: its signature does not match it (the message was "
        "altered on the way, or the client's TOOLEXEC_SIGNING_KEY differs from the workers')"
    ),
}


def signed_headers_of(request: Any) -> dict[str, Any]:
    """The signed headers (:data:`~wire.signing.SIGNED_HEADERS`) of a Celery task request."""
    return {name: getattr(request, name, None) for name in SIGNED_HEADERS}


def check_signature(
    fields: Mapping[str, Any],
    *,
    settings: Settings,
    worker: str,
    task_name: str,
    signature: object,
    headers: Mapping[str, Any],
    queue: str = "",
) -> bool:
    """Whether the call may run: signing is off, or ``signature`` signs it. Else refuse it.

    ``headers`` are the message's signed headers (:func:`signed_headers_of`). Never
    raises for what the message holds.
    """
    if settings.signing_key is None:
        return True
    problem = verify(
        settings.signing_key.get_secret_value(), signature, task_name, fields, headers=headers
    )
    if problem is None:
        return True
    call_id = fields.get("call_id")
    call_id = call_id if isinstance(call_id, str) else None
    client = redis_client(settings)
    payload = json.dumps({"task": task_name, "kwargs": fields}, default=repr, separators=(",", ":"))
    dead_letter(
        client,
        Refusal(problem),
        queue=queue,
        payload=payload,
        detail=_DETAIL[problem],
        call_id=call_id,
    )
    reply_to = fields.get("reply_to")
    if call_id and isinstance(reply_to, str) and reply_to:
        outcome = refusal_outcome(call_id, problem, worker=worker)
        try:
            pipe = client.pipeline(transaction=False)
            pipe.rpush(keys.reply(reply_to), reply_frame(call_id, outcome.model_dump_json()))
            pipe.expire(keys.reply(reply_to), settings.reply_ttl)
            pipe.execute()
        except redis.RedisError as exc:
            logger.error(
                "could not tell the caller of refused call %s: %s", call_id, type(exc).__name__
            )
    return False


def refusal_outcome(call_id: str, problem: SignatureProblem, *, worker: str = "") -> CallOutcome:
    """The error outcome a caller gets for a call refused for ``problem``."""
    return CallOutcome.failure(
        call_id, ErrorKind.EXECUTION, _TYPE[problem], _MESSAGE[problem], worker=worker
    )
