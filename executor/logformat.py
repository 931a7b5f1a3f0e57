"""The worker's JSON log format (``TOOLEXEC_LOG_FORMAT=json``, ``toolexec worker --log-format json``).

toolexec's log records about a call carry its ``call_id``, ``run_id`` and ``tool`` as
record attributes (:func:`executor.tracing.call_log_fields`); Celery's text format
shows none of them. With ``json``, every record a worker writes, in its main process
and its pool processes, is one JSON object on one line::

    {"time": "2025-01-01T12:00:00.123+00:00", "level": "INFO", "logger": "executor.runner",
     "process": 4242, "message": "call c-1 of search raised ValueError",
     "call_id": "c-1", "run_id": "run-7", "tool": "search"}

``call_id``, ``run_id`` and ``tool`` are there when the record is about a call: set on
the record by toolexec, or, for a record a tool logs itself while it runs, taken from
the call it runs in (:func:`executor.context.current_call`). Nothing else of the call is
added: never its arguments or its result. An exception's type is ``exc_type``; its text
and traceback (``exception``) only as the text format would show them.

The format is applied when Celery has set up its loggers (``after_setup_logger``,
``after_setup_task_logger``); pool processes inherit it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from celery import signals

from executor.context import current_call

__all__ = ["JsonFormatter", "use_log_format"]

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
    """Format the worker's log records as ``log_format`` (``text`` or ``json``) once Celery sets them up."""
    global _format
    _format = log_format


def _apply(logger: logging.Logger | None = None, **_: Any) -> None:
    if _format != "json":
        return
    for target in {logging.getLogger(), *([logger] if logger is not None else [])}:
        for handler in target.handlers:
            handler.setFormatter(JsonFormatter())


signals.after_setup_logger.connect(_apply, weak=False)
signals.after_setup_task_logger.connect(_apply, weak=False)
