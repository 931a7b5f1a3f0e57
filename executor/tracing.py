"""What the worker tells observers about a call: log fields, the JSON log format, and spans.

**Celery's view.** A call whose outcome is an error ends its task by raising
:class:`~executor.errors.ToolCallFailed` after the outcome is delivered, so Celery's
events (Flower), ``celery inspect`` and its log show a failure, under the tool's name
(the message's ``shadow`` header).

**Logs.** :func:`call_log_fields` is the ``extra=`` of every log record about a call:
``call_id``, ``run_id`` and ``tool`` become attributes of the record, for a JSON or
logfmt formatter to print. Never arguments or results.

**The JSON log format** (``TOOLEXEC_LOG_FORMAT=json``, ``toolexec worker --log-format
json``). Celery's text format shows none of those attributes. With ``json``, every
record a worker writes, in its main process and its pool processes, is one JSON object
on one line (:class:`JsonFormatter`)::

    {"time": "2025-01-01T12:00:00.123+00:00", "level": "INFO", "logger": "executor.runner",
     "process": 4242, "message": "call c-1 of search raised ValueError",
     "call_id": "c-1", "run_id": "run-7", "tool": "search"}

``call_id``, ``run_id`` and ``tool`` are there when the record is about a call: set on
the record by toolexec, or, for a record a tool logs itself while it runs, taken from
the call it runs in (:func:`executor.context.current_call`). Nothing else of the call is
added: never its arguments or its result. An exception's type is ``exc_type``; its text
and traceback (``exception``) only as the text format would show them. The format is
applied when Celery has set up its loggers (``after_setup_logger``,
``after_setup_task_logger``, connected to :func:`apply_log_format` by
:mod:`executor.seams.app`); pool processes inherit it.

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
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from executor.context import current_call
from wire.models import CallOutcome

__all__ = [
    # Logs
    "JsonFormatter",
    "apply_log_format",
    "call_log_fields",
    "use_log_format",
    # Spans
    "SPAN_PREFIX",
    "CallSpan",
    "call_span",
]

#: The worker's span of a call is named ``toolexec.call <tool>``.
SPAN_PREFIX = "toolexec.call"


def call_log_fields(call_id: str, run_id: str | None, tool: str) -> dict[str, Any]:
    """The ``extra=`` of a log record about one call: its ids and its tool."""
    return {"call_id": call_id, "run_id": run_id, "tool": tool}


# -- the JSON log format ----------------------------------------------------------------

#: The record attributes toolexec sets on a record about a call.
_CALL_FIELDS = ("call_id", "run_id", "tool")

_format = "text"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, process, message, the call's ids."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
            "message": record.getMessage(),
        }
        entry.update(_call_fields(record))
        if record.exc_info and record.exc_info[0] is not None:
            entry["exc_type"] = record.exc_info[0].__name__
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _call_fields(record: logging.LogRecord) -> dict[str, Any]:
    found = {name: getattr(record, name) for name in _CALL_FIELDS if hasattr(record, name)}
    if found:
        return found
    try:
        call = current_call()
    except LookupError:  # not inside a call
        return {}
    return {"call_id": call.call_id, "run_id": call.run_id, "tool": call.tool}


def use_log_format(log_format: str) -> None:
    """Format the worker's log records as ``log_format`` (``text`` or ``json``) once
    Celery sets them up."""
    global _format
    _format = log_format


def apply_log_format(logger: logging.Logger | None = None, **_: Any) -> None:
    """Give the root logger's handlers, and ``logger``'s, the format :func:`use_log_format` chose.

    Celery's ``after_setup_logger`` and ``after_setup_task_logger`` signals call it.
    """
    if _format != "json":
        return
    for target in {logging.getLogger(), *([logger] if logger is not None else [])}:
        for handler in target.handlers:
            handler.setFormatter(JsonFormatter())


# -- spans -----------------------------------------------------------------------------


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


_UNKNOWN = object()
#: Whether :func:`_provider_set` has asked OpenTelemetry once.
_asked = False


def _provider_set(trace: ModuleType) -> bool:
    """Whether a tracer provider of an SDK is set up in this process.

    ``trace.get_tracer_provider()`` alone answers it, but with none set it looks for
    ``OTEL_PYTHON_TRACER_PROVIDER`` in ``os.environ`` at each call, and the lookup of an
    absent variable raises and catches a ``KeyError``: about 4% of the asyncio pool's
    main process at 1,000 calls in flight, for a worker that records nothing. So it is
    asked once; from then on a provider, set in code (``set_tracer_provider``) or loaded
    from that variable by the first answer, is in ``trace._TRACER_PROVIDER``, the
    module's own global, and while that is None none is set. Where the global is missing
    (another OpenTelemetry), it is asked every time. ``tests/unit/test_tracing_provider.py``
    holds this to the API's own answer.
    """
    global _asked
    if _asked and getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
        return False
    _asked = True
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


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
    if trace is None or not _provider_set(trace):
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
