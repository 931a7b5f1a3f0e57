"""OpenTelemetry: the agent's active span travels with the call; the worker's span is its child.

The agent side builds each message with the client's own code (``prepare_call``), under
a span of the test's tracer or under none; Celery's in-process worker runs it, and the
OpenTelemetry SDK's in-memory exporter (in this process, shared by both sides) holds
the spans both made.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agent_client.prepare import PreparedCall, prepare_call, trace_context
from agent_client.validation import ArgumentValidator
from executor.registry import get_tool
from wire.settings import Settings

from .conftest import Register
from .support import next_reply, unique, wait_until

pytestmark = pytest.mark.usefixtures("celery_session_worker")

SECRET = "4111-1111-1111-1111"


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    """Spans this process ends, from the SDK's tracer provider (set once per process)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.clear()


def build(name: str, arguments: dict[str, Any], settings: Settings) -> PreparedCall:
    """The call as the agent's client builds it (in the current span, if any)."""
    spec = get_tool(name)
    assert spec is not None
    return prepare_call(
        spec.spec,
        arguments,
        validator=ArgumentValidator(
            name, spec.spec.parameters, max_bytes=settings.max_argument_bytes
        ),
        settings=settings,
        call_id=unique("call"),
        reply_to=unique("client"),
        timeout=30.0,
        run_id="run-traced",
        idempotency_key=None,
        origin="tests",
    )


def send(app: Celery, call: PreparedCall) -> dict[str, Any]:
    """Publish the client's message (its headers and body, as written) to the worker;
    the headers."""
    envelope = json.loads(call.envelope)
    with app.producer_or_acquire() as producer:
        producer.publish(
            base64.b64decode(envelope["body"]),
            routing_key=app.conf.task_default_queue,
            headers=envelope["headers"],
            content_type="application/json",
            content_encoding="utf-8",
        )
    headers: dict[str, Any] = envelope["headers"]
    return headers


def worker_span(exporter: InMemorySpanExporter, call_id: str) -> ReadableSpan | None:
    """The worker's span of the call ``call_id``, once it has ended."""
    for span in exporter.get_finished_spans():
        if (span.attributes or {}).get("toolexec.call_id") == call_id:
            return span
    return None


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def test_the_workers_span_of_a_call_is_a_child_of_the_agents_active_span(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    settings: Settings,
    exporter: InMemorySpanExporter,
) -> None:
    name = register(add)
    with trace.get_tracer("tests.agent").start_as_current_span("agent step") as parent:
        call = build(name, {"a": 2, "b": 3}, settings)
    headers = send(celery_session_app, call)

    _, outcome = next_reply(client, call.request.reply_to)
    assert outcome.ok and outcome.result == 5
    assert wait_until(lambda: worker_span(exporter, call.call_id) is not None)
    span = worker_span(exporter, call.call_id)
    assert span is not None
    agent = parent.get_span_context()
    assert (
        headers["traceparent"]
        == f"00-{agent.trace_id:032x}-{agent.span_id:016x}-{agent.trace_flags:02x}"
    )
    assert span.parent is not None and span.parent.span_id == agent.span_id
    assert span.context is not None and span.context.trace_id == agent.trace_id
    assert span.name == f"toolexec.call {name}" and span.kind is SpanKind.CONSUMER
    assert dict(span.attributes or {}) == {
        "toolexec.tool": name,
        "toolexec.call_id": call.call_id,
        "toolexec.run_id": "run-traced",
    }
    assert span.status.status_code is StatusCode.UNSET


def test_without_an_active_span_no_trace_header_is_sent_and_the_workers_span_is_a_root(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    settings: Settings,
    exporter: InMemorySpanExporter,
) -> None:
    name = register(add)
    assert trace_context() is None
    call = build(name, {"a": 1, "b": 1}, settings)
    headers = send(celery_session_app, call)

    _, outcome = next_reply(client, call.request.reply_to)
    assert outcome.ok
    assert not {"traceparent", "tracestate", "baggage"} & headers.keys()
    assert wait_until(lambda: worker_span(exporter, call.call_id) is not None)
    span = worker_span(exporter, call.call_id)
    assert span is not None and span.parent is None


def test_a_failed_calls_span_has_an_error_status_with_its_type_and_carries_no_tool_data(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    settings: Settings,
    exporter: InMemorySpanExporter,
) -> None:
    def charge(card: str) -> None:
        """Decline the card."""
        raise ValueError(f"card {card} declined")

    name = register(charge)
    with trace.get_tracer("tests.agent").start_as_current_span("agent step"):
        call = build(name, {"card": SECRET}, settings)
    send(celery_session_app, call)

    _, outcome = next_reply(client, call.request.reply_to)
    assert outcome.error is not None and SECRET in outcome.error.message  # the caller gets it
    assert wait_until(lambda: worker_span(exporter, call.call_id) is not None)
    span = worker_span(exporter, call.call_id)
    assert span is not None
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "ValueError"
    assert (span.attributes or {})["toolexec.error.kind"] == "execution"
    assert (span.attributes or {})["toolexec.error.type"] == "ValueError"
    assert SECRET not in json.dumps(
        {"attributes": dict(span.attributes or {}), "status": span.status.description}
    )
    assert list(span.events) == []  # no exception recorded: its message quotes the card
