"""Optional message signing: an HMAC-SHA256 under a key the client and workers share.

With ``TOOLEXEC_SIGNING_KEY`` set, the client adds one header to each task message,
:data:`SIGNATURE_HEADER`, holding the hex HMAC-SHA256 of :func:`signed_bytes`: the
Celery task name (the delivery mode), every field of the call the worker acts on (call
id, tool, reply address, deadline, run id, idempotency key), the task message headers
that decide whether and for how long Celery runs it (:data:`SIGNED_HEADERS`: its task
id, ``expires``, ``timelimit`` and ``eta``), then the arguments' JSON exactly as it went
on the wire. A worker with the key recomputes it from the task's keyword arguments and
those headers before anything runs, and refuses a message that is unsigned or whose
signature does not match (:func:`verify`). So a message whose hard limit was raised or
removed (``timelimit``: Celery's backstop that reclaims a stuck process), whose expiry
was moved, or that was given a task id of another call, is refused like one whose
arguments were changed. The other headers are Celery's bookkeeping (``argsrepr``,
``origin``, ``retries``...) or fixed by the task name; the signed header is written as
``send_task(headers=...)`` writes one, so the contract tests still compare the message
field for field.

The client signs bytes it has already built (the arguments are encoded once, for the
size check), so signing costs one short ``json.dumps`` and one HMAC per call:
``python -m bench.signing`` prints it. The worker encodes the arguments it received
again; JSON that a client wrote decodes and encodes back to the same bytes.

Signing authenticates a message; it does not hide it (use ``rediss://``), and a signed
message captured from the queue can be sent again until its deadline passes.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from wire.message import ArgumentsNotJSON, encode_arguments

__all__ = [
    "MAKE_KEY",
    "MIN_KEY_CHARS",
    "SIGNATURE_HEADER",
    "SIGNED_HEADERS",
    "SignatureProblem",
    "sign",
    "signed_bytes",
    "verify",
]

#: The task message header that carries the signature (hex HMAC-SHA256).
SIGNATURE_HEADER = "toolexec_signature"
#: The shortest key accepted: 16 characters (``secrets.token_hex(32)`` gives 64).
MIN_KEY_CHARS = 16
#: A command that prints a good key, for messages that ask for one.
MAKE_KEY = "python -c 'import secrets; print(secrets.token_hex(32))'"
#: Why a worker refused a message: no signature, or one that does not match.
SignatureProblem = Literal["unsigned", "signature_mismatch"]

#: The task message headers a signature covers, besides the call's own fields.
SIGNED_HEADERS = ("id", "expires", "timelimit", "eta")

_VERSION = "toolexec-hmac-sha256-v2"


def signed_bytes(
    task_name: str,
    *,
    call_id: Any,
    tool: Any,
    reply_to: Any,
    deadline: Any,
    run_id: Any,
    idempotency_key: Any,
    arguments_json: bytes,
    headers: Mapping[str, Any],
) -> bytes:
    """What the signature covers: a JSON array of the call's fields, a newline, the arguments.

    The array ends with the values of :data:`SIGNED_HEADERS` in ``headers`` (None for
    one that is absent). It holds no raw newline, so the first one ends it unambiguously.

    Raises:
        ValueError: A field is not a JSON value (only a forged message has one).
    """
    signed_headers = [_signed_value(name, headers.get(name)) for name in SIGNED_HEADERS]
    head = [
        _VERSION,
        task_name,
        call_id,
        tool,
        reply_to,
        deadline,
        run_id,
        idempotency_key,
        signed_headers,
    ]
    try:
        encoded = json.dumps(head, separators=(",", ":"), allow_nan=False)
    except (TypeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    return encoded.encode() + b"\n" + arguments_json


def _signed_value(name: str, value: Any) -> Any:
    """A signed header's value; ``expires`` and ``eta`` as the instant, in milliseconds.

    An instant is signed rather than its text: ``send_task`` writes the same instant as
    other text, and a worker whose message it wrote must verify it too.

    Raises:
        ValueError: The instant is not ISO 8601 text (only a forged message has one).
    """
    if name not in ("expires", "eta") or value is None:
        return value
    instant = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return round(instant.timestamp() * 1000)


def _key_bytes(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def sign(
    key: str | bytes,
    task_name: str,
    *,
    call_id: str,
    tool: str,
    reply_to: str,
    deadline: float | None,
    run_id: str | None,
    idempotency_key: str | None,
    arguments_json: bytes,
    headers: Mapping[str, Any],
) -> str:
    """The hex HMAC-SHA256 of a call's :func:`signed_bytes` under ``key``.

    ``headers`` are the task message's headers as they go on the wire.
    """
    message = signed_bytes(
        task_name,
        call_id=call_id,
        tool=tool,
        reply_to=reply_to,
        deadline=deadline,
        run_id=run_id,
        idempotency_key=idempotency_key,
        arguments_json=arguments_json,
        headers=headers,
    )
    return hmac.digest(_key_bytes(key), message, "sha256").hex()


def verify(
    key: str | bytes,
    signature: object,
    task_name: str,
    fields: Mapping[str, Any],
    *,
    headers: Mapping[str, Any],
) -> SignatureProblem | None:
    """None when ``signature`` signs the task's keyword arguments and headers; else why not.

    ``fields`` are the keyword arguments as the worker decoded them; a field missing
    from them takes :class:`~wire.models.CallRequest`'s default, as the client's
    request would have. ``headers`` are the message's headers as decoded (Celery's
    task request: ``request.timelimit``, ...); only :data:`SIGNED_HEADERS` are read.
    """
    if not isinstance(signature, str) or not signature:
        return "unsigned"
    try:
        arguments_json = encode_arguments(fields.get("arguments", {}))
        message = signed_bytes(
            task_name,
            call_id=fields.get("call_id"),
            tool=fields.get("tool"),
            reply_to=fields.get("reply_to", ""),
            deadline=fields.get("deadline"),
            run_id=fields.get("run_id"),
            idempotency_key=fields.get("idempotency_key"),
            arguments_json=arguments_json,
            headers=headers,
        )
    except (ArgumentsNotJSON, ValueError, TypeError, RecursionError):
        return "signature_mismatch"
    expected = hmac.digest(_key_bytes(key), message, "sha256").hex()
    return None if hmac.compare_digest(expected, signature) else "signature_mismatch"
