"""What the worker tells observers about a call: log fields and an optional OpenTelemetry span.

**Celery's view.** A call whose outcome is an error ends its task by raising
:class:`ToolCallFailed` after the outcome is delivered, so Celery's events (Flower),
``celery inspect`` and its log show a failure, under the tool's name (the message's
``shadow`` header). Its message is the error's type and kind only, never the tool's
message; the task declares it expected (``throws``), so Celery logs it at INFO,
without a traceback, and the reply backend sends no second outcome for it.

**Logs.** :func:`call_log_fields` is the ``extra=`` of every log record about a call:
``call_id``, ``run_id`` and ``tool`` become attributes of the record, for a JSON or
logfmt formatter to print. Never arguments or results.

**Spans.** When the agent's process had an active span as it sent the call, the
message carries its W3C trace context (``traceparent``, ``tracestate``, ``baggage``:
whatever the agent's configured propagators write) as headers. :func:`call_span`
opens the worker's span for the call, ``toolexec.call <tool>``, as a child of that
span (a root span when there is none), with the attributes ``toolexec.tool``,
``toolexec.call_id`` and ``toolexec.run_id``; a failed call sets the span's status to
ERROR with its error type, and ``toolexec.error.kind`` / ``toolexec.error.type``
(never the error's message, which may quote tool data).

OpenTelemetry is optional: without ``opentelemetry-api`` installed, or with no tracer
provider set in the worker (an SDK the deployment configures, for example with
``opentelemetry-instrument`` or in a tool module), :func:`call_span` does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from wire.models import CallOutcome

__all__ = ["SPAN_PREFIX", "CallSpan", "ToolCallFailed", "call_log_fields", "call_span"]

#: The worker's span of a call is named ``toolexec.call <tool>``.
SPAN_PREFIX = "toolexec.call"


class ToolCallFailed(Exception):
    """How a task whose call failed ends, after its outcome reached the caller.

    The message is ``<error type> (<error kind>)``, e.g. ``ValueError (execution)``.
    """

    def __init__(self, description: str) -> None:
        super().__init__(description)

    @classmethod
    def of(cls, outcome: CallOutcome) -> ToolCallFailed | None:
        """The exception for ``outcome``, or None when it is a success."""
        error = outcome.error
        return None if error is None else cls(f"{error.type} ({error.kind.value})")


def call_log_fields(call_id: str, run_id: str | None, tool: str) -> dict[str, Any]:
    """The ``extra=`` of a log record about one call: its ids and its tool."""
    return {"call_id": call_id, "run_id": run_id, "tool": tool}


class CallSpan:
    """The worker's span of one call; a no-op without OpenTelemetry."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def record(self, outcome: CallOutcome | None) -> None:
        """Mark the span with how the call ended (None: this delivery delivered nothing)."""
        if self._span is None or outcome is None or outcome.error is None:
            return
        from opentelemetry.trace import Status, StatusCode

        error = outcome.error
        self._span.set_attribute("toolexec.error.kind", error.kind.value)
        self._span.set_attribute("toolexec.error.type", error.type)
        self._span.set_status(Status(StatusCode.ERROR, error.type))


@functools.cache
def _trace_api() -> ModuleType | None:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace


@contextmanager
def call_span(request: Any, fields: Mapping[str, Any]) -> Iterator[CallSpan]:
    """The worker's span of the call in a task's ``fields``, child of the agent's span if any.

    Args:
        request: The task's request (``self.request``): the message's headers are its
            attributes.
        fields: The task's keyword arguments (the call).
    """
    trace = _trace_api()
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        yield CallSpan()  # no OpenTelemetry, or no SDK set up in this worker: nothing to record
        return
    from opentelemetry import propagate

    headers = getattr(request, "__dict__", None) or {}
    parent = propagate.extract({k: v for k, v in headers.items() if isinstance(v, str)})
    tool = str(fields.get("tool"))
    attributes = {"toolexec.tool": tool, "toolexec.call_id": str(fields.get("call_id"))}
    run_id = fields.get("run_id")
    if isinstance(run_id, str):
        attributes["toolexec.run_id"] = run_id
    tracer = trace.get_tracer("toolexec.executor")
    with tracer.start_as_current_span(
        f"{SPAN_PREFIX} {tool}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,  # an exception's message may quote tool data
        set_status_on_exception=False,
    ) as span:
        try:
            yield CallSpan(span)
        except BaseException as exc:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
