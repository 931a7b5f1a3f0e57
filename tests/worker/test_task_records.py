"""What the worker records of a call: log fields, Celery's end state, progress frames.

* Each log record about a call carries ``call_id``, ``run_id`` and ``tool`` as record
  attributes, and at INFO and above no argument, result or error message.
* A call whose outcome is an error ends its task as a failure (``ToolCallFailed``: the
  error's type and kind only) after the one outcome was delivered; an at-least-once
  call that failed is acknowledged, not run again.
* Progress frames reach the reply list before the outcome, in order, and none after it,
  even from a tool thread abandoned at its hard limit that reports on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, signals

from executor import report_progress
from executor.errors import ToolCallFailed
from executor.task import run_call
from wire import keys
from wire.clock import shared_now
from wire.formats import parse_frame, parse_progress
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallOutcome, CallRequest, ErrorKind
from wire.settings import Settings

from .conftest import WORKER_HOSTNAME, Register
from .support import make_call, next_reply, unique, wait_until

pytestmark = pytest.mark.usefixtures("celery_session_worker")

SECRET = "4111-1111-1111-1111"


def send(app: Celery, call: CallRequest, task: str = TASK_AT_MOST_ONCE) -> None:
    """Send ``call`` as the task's keyword arguments, with the call id as the task id."""
    app.send_task(task, kwargs=call.model_dump(mode="json"), task_id=call.call_id, shadow=call.tool)


# -- log records ------------------------------------------------------------------------


def charge(card: str) -> None:
    """Decline the card, quoting it."""
    raise ValueError(f"card {card} declined")


def charge_slowly(card: str) -> str:
    """Take longer than the hard limit."""
    time.sleep(1.0)
    return card


def charge_once(card: str) -> str:
    """Return the card (an idempotent tool: a repeat is answered from the store)."""
    return f"charged {card}"


CASES: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {
    "raised": (charge, {}, {}),
    "expired": (charge, {}, {"deadline": 1.0}),
    "hard_timeout": (charge_slowly, {"hard_timeout": 0.2}, {}),
    "stored": (charge_once, {"idempotent": True}, {"idempotency_key": "key-logs"}),
}


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_a_calls_log_records_carry_its_ids_and_tool_and_none_of_its_data(
    case: str, register: Register, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    func, options, fields = CASES[case]
    name = register(func, **options)
    if "idempotency_key" in fields:
        fields = {**fields, "idempotency_key": unique("key")}
    call = make_call(name, arguments={"card": SECRET}, run_id="run-logs", **fields)
    if case == "stored":  # a first delivery stores the outcome; the second is answered from it
        run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER_HOSTNAME)
    caplog.set_level(logging.DEBUG, logger="executor")

    run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER_HOSTNAME)

    records = [
        r for r in caplog.records if r.name.startswith("executor.") and r.levelno >= logging.INFO
    ]
    assert records, "the call left no log record"
    for record in records:
        assert (record.call_id, record.run_id, record.tool) == (call.call_id, "run-logs", name), (
            record
        )
        assert call.call_id in record.getMessage() and name in record.getMessage()
    # At INFO and above: the message, the record's attributes, any traceback.
    shown = [
        (r.getMessage(), repr(r.__dict__)) for r in caplog.records if r.levelno >= logging.INFO
    ]
    assert SECRET not in json.dumps(shown, default=str)


# -- Celery's end state ----------------------------------------------------------------------


@pytest.fixture
def failures() -> Iterator[list[tuple[str, BaseException]]]:
    """(task id, exception) of every task failure Celery reports during the test."""
    seen: list[tuple[str, BaseException]] = []

    def record(task_id: str = "", exception: BaseException | None = None, **_: Any) -> None:
        if exception is not None:
            seen.append((task_id, exception))

    signals.task_failure.connect(record, weak=False)
    yield seen
    signals.task_failure.disconnect(record)


@pytest.mark.parametrize("task", [TASK_AT_MOST_ONCE, TASK_AT_LEAST_ONCE])
def test_a_failed_call_gets_one_outcome_and_its_task_fails_with_only_the_error_type(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    failures: list[tuple[str, BaseException]],
    caplog: pytest.LogCaptureFixture,
    task: str,
) -> None:
    caplog.set_level(logging.INFO, logger="celery.app.trace")
    runs: list[str] = []

    def decline(card: str) -> None:
        """Decline the card, quoting it."""
        runs.append(card)
        raise ValueError(f"card {card} declined")

    call = make_call(register(decline), arguments={"card": SECRET})
    send(celery_session_app, call, task)

    _, outcome = next_reply(client, call.reply_to)
    assert outcome.error is not None and outcome.error.kind is ErrorKind.EXECUTION
    assert wait_until(lambda: any(task_id == call.call_id for task_id, _ in failures))
    # Run another call to the end: a second outcome, or a requeued first call, would be done by now.
    after = make_call(register(charge_once), arguments={"card": "0000"})
    send(celery_session_app, after, task)
    assert next_reply(client, after.reply_to)[1].ok

    assert client.llen(keys.reply(call.reply_to)) == 0
    assert runs == [SECRET]
    (exception,) = [exc for task_id, exc in failures if task_id == call.call_id]
    assert isinstance(exception, ToolCallFailed) and str(exception) == "ValueError (execution)"
    logged = [r for r in caplog.records if call.call_id in r.getMessage()]
    assert logged and all(r.levelno == logging.INFO and r.exc_info is None for r in logged)
    assert "raised expected: ToolCallFailed('ValueError (execution)')" in logged[-1].getMessage()
    assert not any(SECRET in r.getMessage() for r in caplog.records)


def test_a_successful_call_ends_its_task_as_a_success(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    failures: list[tuple[str, BaseException]],
) -> None:
    succeeded: list[str] = []

    def record(sender: Any = None, **_: Any) -> None:
        succeeded.append(str(getattr(getattr(sender, "request", None), "id", "")))

    signals.task_success.connect(record, weak=False)
    try:
        call = make_call(register(charge_once), arguments={"card": "0000"})
        send(celery_session_app, call)
        assert next_reply(client, call.reply_to)[1].ok
        assert wait_until(lambda: call.call_id in succeeded)
    finally:
        signals.task_success.disconnect(record)
    assert not any(task_id == call.call_id for task_id, _ in failures)


# -- progress frames ----------------------------------------------------------------------


def frames_of(client: redis.Redis, reply_to: str) -> list[tuple[str, Any]]:
    """Every frame on ``reply_to``'s list, oldest first: ("progress", (seq, done, ...))
    or ("outcome", ...)."""
    found: list[tuple[str, Any]] = []
    for frame in client.lrange(keys.reply(reply_to), 0, -1):
        _, is_progress, body = parse_frame(frame)
        if is_progress:
            found.append(("progress", parse_progress(body)))
        else:
            found.append(("outcome", CallOutcome.model_validate_json(body)))
    return found


def test_progress_frames_come_before_the_outcome_in_order_ending_with_the_last_report(
    celery_session_app: Celery, client: redis.Redis, register: Register
) -> None:
    def steps(count: int) -> int:
        """Report `count` steps, 30 ms apart."""
        for step in range(1, count + 1):
            report_progress(step, count, f"step {step}")
            time.sleep(0.03)
        return count

    call = make_call(register(steps), arguments={"count": 12})
    send(celery_session_app, call)
    assert wait_until(
        lambda: any(kind == "outcome" for kind, _ in frames_of(client, call.reply_to))
    )

    frames = frames_of(client, call.reply_to)
    *progress, (kind, outcome) = frames
    assert kind == "outcome" and outcome.ok and outcome.result == 12
    assert progress and all(kind == "progress" for kind, _ in progress)
    seqs = [report[0] for _, report in progress]
    assert seqs == sorted(set(seqs))
    assert progress[-1][1][1:] == (12.0, 12.0, "step 12")
    assert len(progress) < 12  # throttled: at most one frame per 100 ms, not one per report


def test_a_tool_thread_abandoned_at_its_hard_limit_reports_into_nothing(
    celery_session_app: Celery, client: redis.Redis, register: Register
) -> None:
    finished = threading.Event()

    def runaway() -> None:
        """Report every 20 ms for 1.2 s, past the hard limit of 0.3 s."""
        try:
            ends = time.monotonic() + 1.2
            step = 0
            while time.monotonic() < ends:
                step += 1
                report_progress(step)
                time.sleep(0.02)
        finally:
            finished.set()

    call = make_call(register(runaway, hard_timeout=0.3), deadline=shared_now() + 30)
    send(celery_session_app, call)
    assert finished.wait(10.0)

    frames = frames_of(client, call.reply_to)
    kind, outcome = frames[-1]
    assert (
        kind == "outcome"
        and outcome.error is not None
        and outcome.error.kind is ErrorKind.HARD_TIMEOUT
    )
    assert [kind for kind, _ in frames[:-1]] == ["progress"] * (len(frames) - 1)
    assert len(frames) >= 2  # it did report before its limit
