"""The worker's JSON log format: one object per record, with the call's ids, no tool data."""

from __future__ import annotations

import json
import logging
import sys

from executor.context import CallContext, _calling
from executor.tracing import JsonFormatter, call_log_fields


def _record(
    msg: str, *args: object, extra: dict[str, object] | None = None, exc: bool = False
) -> logging.LogRecord:
    record = logging.LogRecord(
        "executor.runner", logging.INFO, __file__, 1, msg, args, sys.exc_info() if exc else None
    )
    for name, value in (extra or {}).items():
        setattr(record, name, value)
    return record


def test_a_record_about_a_call_carries_its_call_id_run_id_and_tool() -> None:
    record = _record(
        "call %s of %s raised %s",
        "c-1",
        "search",
        "ValueError",
        extra=call_log_fields("c-1", "run-7", "search"),
    )

    entry = json.loads(JsonFormatter().format(record))

    assert entry["message"] == "call c-1 of search raised ValueError"
    assert (entry["call_id"], entry["run_id"], entry["tool"]) == ("c-1", "run-7", "search")
    assert (entry["level"], entry["logger"]) == ("INFO", "executor.runner")
    assert set(entry) == {
        "time",
        "level",
        "logger",
        "process",
        "message",
        "call_id",
        "run_id",
        "tool",
    }


def test_a_record_a_tool_logs_while_it_runs_takes_the_ids_of_its_call() -> None:
    context = CallContext(
        call_id="c-2", run_id=None, tool="book_flight", idempotency_key="k", deadline=None
    )
    with _calling(context):
        entry = json.loads(JsonFormatter().format(_record("booking")))

    assert (entry["call_id"], entry["run_id"], entry["tool"]) == ("c-2", None, "book_flight")
    assert "idempotency_key" not in entry and "deadline" not in entry


def test_a_record_outside_any_call_has_no_call_fields_and_an_exception_keeps_its_type() -> None:
    try:
        raise KeyError("x")
    except KeyError:
        entry = json.loads(JsonFormatter().format(_record("worker ready", exc=True)))

    assert not {"call_id", "run_id", "tool"} & set(entry)
    assert entry["exc_type"] == "KeyError" and "Traceback" in entry["exception"]
