"""A call made under an active OpenTelemetry span: send_task's message with the trace headers.

The client adds the W3C trace context of the caller's active span to the message's
headers (``wire.message.task_headers(extra_headers=...)``) where ``send_task(headers=...)``
puts custom headers; without an active span it adds nothing (``test_envelope``).
"""

from __future__ import annotations

import os
import uuid

import redis
from celery import Celery
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from agent_client.prepare import prepare_call
from agent_client.validation import ArgumentValidator
from wire.models import ToolSpec, task_name_for
from wire.settings import Settings

from .support import Check, differences, kwargsrepr_of
from .test_envelope import SCHEMA, decoded, nonempty_strings, routed_to

TRACE_ID, SPAN_ID = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331


def test_a_traced_calls_message_is_send_tasks_with_the_trace_headers(
    redis_client: redis.Redis, producer: Celery, contract_settings: Settings
) -> None:
    queue_a, queue_b = f"contract-client-{uuid.uuid4().hex}", f"contract-stock-{uuid.uuid4().hex}"
    spec = ToolSpec(name="search", description="d", parameters=SCHEMA, queue=queue_a)
    active = NonRecordingSpan(
        SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(1))
    )
    with trace.use_span(active):
        call = prepare_call(
            spec,
            {"query": "fox"},
            validator=ArgumentValidator(spec.name, spec.parameters, max_bytes=1024),
            settings=contract_settings,
            call_id=uuid.uuid4().hex,
            reply_to=f"contract-client-{uuid.uuid4().hex[:8]}",
            timeout=None,
            run_id=None,
            idempotency_key=None,
            origin=f"toolexec-client@{os.getpid()}",
        )
    traceparent = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    redis_client.lpush(queue_a, call.envelope)
    producer.send_task(
        task_name_for(spec.delivery),
        kwargs=call.request.model_dump(mode="json"),
        queue=queue_b,
        task_id=call.call_id,
        ignore_result=True,
        argsrepr="()",
        kwargsrepr=kwargsrepr_of("search"),
        shadow="search",
        headers={"traceparent": traceparent},
    )

    raw_client, raw_stock = redis_client.rpop(queue_a), redis_client.rpop(queue_b)
    assert raw_client is not None and raw_stock is not None
    client, stock = decoded(raw_client), decoded(raw_stock)
    allowed: dict[str, Check] = {
        "headers.origin": nonempty_strings,
        "properties.reply_to": nonempty_strings,
        "properties.delivery_tag": nonempty_strings,
        "properties.delivery_info.routing_key": routed_to(queue_a, queue_b),
    }
    problems = differences(client, stock, allowed)
    assert not problems, "the client's message differs from send_task's:\n" + "\n".join(problems)
    assert client["headers"]["traceparent"] == traceparent
    assert client["headers"]["shadow"] == "search"
