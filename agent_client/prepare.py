"""Prepare a call: validate, key, encode once. No I/O.

:func:`prepare_call` turns a tool's spec and the model's arguments into a
:class:`PreparedCall`: the :class:`~wire.models.CallRequest`, the Celery message ready
for the queue's list, the TTL of its sent marker and, for an idempotent tool, its key
and claim TTL (:func:`wire.keys.call_ttl_ms`). Sending it
(:mod:`agent_client._io.send`) and waiting for it (:mod:`agent_client.deadline`) are separate.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass

from agent_client.runs import check_key
from agent_client.runs import idempotency_key as key_for
from agent_client.validation import ArgumentValidator
from wire import keys
from wire.clock import shared_now
from wire.message import CELERY_LIMIT_MARGIN, redis_envelope, task_headers
from wire.models import CallRequest, ToolSpec, task_name_for
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER, sign

__all__ = ["PreparedCall", "prepare_call", "trace_context"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedCall:
    """One call, ready to send.

    Attributes:
        spec: The tool's spec.
        request: What the worker receives (the task's keyword arguments).
        envelope: The message as it goes onto the queue's Redis list.
        claim_ttl_ms: For an idempotent tool, the TTL of its claim; else None.
        sent_ttl_ms: The TTL of its sent marker, if it is pushed as a plain call.
    """

    spec: ToolSpec
    request: CallRequest
    envelope: str
    claim_ttl_ms: int | None
    sent_ttl_ms: int

    @property
    def call_id(self) -> str:
        """The call's id (also the Celery task id)."""
        return self.request.call_id

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key, for an idempotent tool."""
        return self.request.idempotency_key

    @property
    def running_keys(self) -> tuple[str, ...]:
        """Where workers record who holds this call."""
        return keys.running_keys(self.request.call_id, self.request.idempotency_key)


def trace_context() -> dict[str, str] | None:
    """The active OpenTelemetry span's context as message headers (W3C ``traceparent``...).

    None unless this process has imported OpenTelemetry (as it has if it made a span)
    and a span is active: the cost is one dict lookup otherwise. The headers are what
    the configured propagators write; the worker's span of the call is its child.
    """
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def prepare_call(
    spec: ToolSpec,
    arguments: dict[str, object],
    *,
    validator: ArgumentValidator,
    settings: Settings,
    call_id: str,
    reply_to: str,
    timeout: float | None,
    run_id: str | None,
    idempotency_key: str | None,
    origin: str,
    caller_beats: bool = False,
    handle: bool = False,
) -> PreparedCall:
    """Validate ``arguments`` and build the call's message; nothing is sent.

    Raises:
        ToolArgumentsInvalid: The arguments do not fit the schema, are not JSON, or are
            too large; the message names each offending field.
    """
    # 1. Validate and encode the arguments, once; the run and key as the wire takes them.
    encoded = validator.check(arguments)
    check_key(run_id, what="run_id")
    check_key(idempotency_key, what="idempotency_key")
    # 2. The run and, for an idempotent tool, the key.
    if spec.idempotent and idempotency_key is None:
        run_id = run_id or uuid.uuid4().hex  # outside a run: a run of its own
        idempotency_key = key_for(run_id, spec.name, spec.parameters, arguments)
    # 3. The request the worker receives.
    now: float | None = None
    deadline: float | None = None
    if timeout is not None:
        now = shared_now()  # Redis' clock
        deadline = now + timeout
    request = CallRequest.model_construct(  # fields built here are valid by construction
        call_id=call_id,
        tool=spec.name,
        arguments=arguments,
        reply_to=reply_to,
        deadline=deadline,
        run_id=run_id,
        idempotency_key=idempotency_key,
        caller_beats=caller_beats and not handle,  # a submitted call outlives its sender
        handle=handle,
    )
    # 4. The Celery message, with the encoded arguments spliced in.
    longest = spec.longest_run()  # every attempt of a tool that retries, and their pauses
    hard = longest + CELERY_LIMIT_MARGIN if longest else None
    task_name = task_name_for(spec.delivery)
    headers = task_headers(
        request, task_name=task_name, hard_limit=hard, origin=origin, extra_headers=trace_context()
    )
    if settings.signing_key is not None:  # one HMAC over bytes already built
        headers[SIGNATURE_HEADER] = sign(
            settings.signing_key.get_secret_value(),
            task_name,
            call_id=call_id,
            tool=spec.name,
            reply_to=reply_to,
            deadline=request.deadline,
            run_id=run_id,
            idempotency_key=idempotency_key,
            arguments_json=encoded,
            headers=headers,
        )
    envelope = redis_envelope(request, queue=spec.queue, headers=headers, arguments_json=encoded)
    # 5. How long its keys live: its claim, and its sent marker if pushed as a plain call.
    claim_ttl = None
    if idempotency_key is not None:
        claim_ttl = keys.call_ttl_ms(
            "claim", deadline=deadline, hard_timeout=spec.hard_timeout, settings=settings, now=now
        )
    sent_ttl = keys.call_ttl_ms(
        "sent", deadline=deadline, hard_timeout=spec.hard_timeout, settings=settings, now=now
    )
    return PreparedCall(
        spec=spec, request=request, envelope=envelope, claim_ttl_ms=claim_ttl, sent_ttl_ms=sent_ttl
    )
